// bench_preempt_check: what the per-step stop check (PreemptionWatcher::ShouldStop) costs, and
// that it agrees. Times --iters calls of ShouldStop against, in the same run, a plain
// MPI_Allreduce of the same two int64 on MPI_COMM_WORLD (what the check costs without the
// communicator's deadline) and the communicator's Barrier. Then, unless --signal-at is 0, one
// rank raises SIGUSR1 just before check number --signal-at and every rank must stop at exactly
// that check (exit 1 otherwise). Last line JSON.
//
//   launch/mpirun.sh -np 8 build/bin/bench_preempt_check --iters 20000
#include <mpi.h>
#include <signal.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <vector>

#include "benchmarks/bench_util.h"
#include "shardckpt/collectives/mpi_communicator.h"
#include "shardckpt/collectives/preemption.h"

using namespace shardckpt;
using namespace shardckpt::bench;
namespace po = boost::program_options;

namespace {

struct Stats {
  double median_us = 0, p99_us = 0, mean_us = 0;
};

// Per-call times on this rank, then the worst rank's figure for each statistic.
template <typename F>
Stats TimeCalls(Communicator& comm, int iters, F&& call) {
  std::vector<double> us(iters);
  comm.Barrier().IgnoreError();
  double total = 0;
  for (int i = 0; i < iters; ++i) {
    double t0 = NowSeconds();
    call();
    us[i] = (NowSeconds() - t0) * 1e6;
    total += us[i];
  }
  std::sort(us.begin(), us.end());
  double figures[3] = {us[iters / 2], us[std::min(iters - 1, iters * 99 / 100)], total / iters};
  std::vector<std::string> all;
  std::string mine(reinterpret_cast<const char*>(figures), sizeof(figures));
  comm.AllGather(mine, &all).IgnoreError();
  Stats worst;
  for (const std::string& bytes : all) {
    const double* f = reinterpret_cast<const double*>(bytes.data());
    worst.median_us = std::max(worst.median_us, f[0]);
    worst.p99_us = std::max(worst.p99_us, f[1]);
    worst.mean_us = std::max(worst.mean_us, f[2]);
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  auto session = MpiSession::Init(&argc, &argv).value();
  po::options_description flags("bench_preempt_check");
  flags.add_options()("help", "this text")
      ("iters", po::value<int>()->default_value(20000), "timed calls of each kind")
      ("signal-at", po::value<int>()->default_value(100), "raise SIGUSR1 before this check of the agreement run (0: skip)")
      ("signal-rank", po::value<int>()->default_value(-1), "the rank that raises it (-1: the last)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, flags), vm);
  auto comm = CreateMpiCommunicator().value();
  const int rank = comm->rank(), size = comm->size();
  if (vm.count("help")) {
    if (rank == 0) std::cout << flags << "\n";
    return 0;
  }
  const int iters = std::max(1, vm["iters"].as<int>());
  const int signal_at = vm["signal-at"].as<int>();
  const int signal_rank = vm["signal-rank"].as<int>() < 0 ? size - 1 : vm["signal-rank"].as<int>();
  auto watcher = PreemptionWatcher::Install().value();

  Stats check = TimeCalls(*comm, iters, [&] { watcher->ShouldStop(*comm).value(); });
  Stats raw = TimeCalls(*comm, iters, [&] {
    int64_t values[2] = {0, -1};
    MPI_Allreduce(MPI_IN_PLACE, values, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  });
  Stats barrier = TimeCalls(*comm, iters, [&] { comm->Barrier().IgnoreError(); });

  // Agreement: the signal lands on one rank only, between two checks; everyone must stop at the
  // check right after it, and name that rank and signal.
  int stopped_at = -1;
  StopRequest stop;
  for (int i = 1; signal_at > 0 && i <= signal_at + 10 && stopped_at < 0; ++i) {
    if (i == signal_at && rank == signal_rank) raise(SIGUSR1);
    stop = watcher->ShouldStop(*comm).value();
    if (stop.requested) stopped_at = i;
  }
  bool agreed = signal_at == 0 || (stopped_at == signal_at && stop.first_rank == signal_rank && stop.signal == SIGUSR1);
  int64_t any_bad = agreed ? 0 : 1;
  comm->AllReduceMaxInt64(&any_bad, 1).IgnoreError();
  if (!agreed) {
    std::fprintf(stderr, "rank %d: stopped at check %d (expected %d), first rank %d, %s\n", rank, stopped_at, signal_at,
                 stop.first_rank, SignalName(stop.signal).c_str());
  }
  if (rank == 0) {
    std::printf("%d ranks, %d calls each; per call, worst rank: median / p99 / mean microseconds\n", size, iters);
    std::printf("  ShouldStop              %8.1f %8.1f %8.1f\n", check.median_us, check.p99_us, check.mean_us);
    std::printf("  MPI_Allreduce (2 int64) %8.1f %8.1f %8.1f\n", raw.median_us, raw.p99_us, raw.mean_us);
    std::printf("  Barrier                 %8.1f %8.1f %8.1f\n", barrier.median_us, barrier.p99_us, barrier.mean_us);
    if (signal_at > 0) {
      std::printf("agreement: SIGUSR1 on rank %d before check %d: %s\n", signal_rank, signal_at,
                  any_bad ? "NOT every rank stopped there" : "every rank stopped at that check");
    }
    PrintJson({{"bench", "\"preempt_check\""}, {"ranks", std::to_string(size)}, {"iters", std::to_string(iters)},
               {"check_median_us", Num(check.median_us)}, {"check_p99_us", Num(check.p99_us)},
               {"check_mean_us", Num(check.mean_us)}, {"raw_allreduce_median_us", Num(raw.median_us)},
               {"barrier_median_us", Num(barrier.median_us)}, {"agreed", any_bad ? "false" : "true"}});
  }
  return any_bad ? 1 : 0;
}
