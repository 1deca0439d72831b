#include "tools/interrupt.h"

#include <signal.h>

#include <atomic>
#include <cstring>
#include <string>
#include <utility>

namespace shardckpt::tools {
namespace {

// Lock-free atomic, not volatile sig_atomic_t: the signal may land on any of the tool's threads.
std::atomic<int> g_caught{0};
static_assert(std::atomic<int>::is_always_lock_free);
struct sigaction g_previous_int, g_previous_term;

void OnSignal(int signal) { g_caught.store(signal, std::memory_order_relaxed); }

}  // namespace

InterruptScope::InterruptScope() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;  // a second signal takes its default action: the process ends
  // A signal ignored when the tool started (nohup, a shell's background job) stays ignored.
  for (auto [signal, previous] : {std::pair{SIGINT, &g_previous_int}, std::pair{SIGTERM, &g_previous_term}}) {
    sigaction(signal, nullptr, previous);
    if (previous->sa_handler != SIG_IGN) sigaction(signal, &action, nullptr);
  }
}

InterruptScope::~InterruptScope() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
}

Status InterruptScope::Check() {
  const int caught = g_caught.load(std::memory_order_relaxed);
  if (caught == 0) return Status::Ok();
  return Status(Code::kAborted, std::string("interrupted by ") + (caught == SIGINT ? "SIGINT (Ctrl-C)" : "SIGTERM") +
                                    ": stopped, and the partial output removed");
}

int InterruptScope::Caught() { return g_caught.load(std::memory_order_relaxed); }

}  // namespace shardckpt::tools
