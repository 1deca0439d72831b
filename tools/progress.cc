#include "tools/progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace shardckpt::tools {
namespace {
double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
std::string Human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", bytes, units[u]);
  return buf;
}
}  // namespace

ProgressBar::ProgressBar(std::string label, bool enabled, std::string unit)
    : label_(std::move(label)), enabled_(enabled && ::isatty(STDERR_FILENO)), unit_(std::move(unit)), start_(Now()) {}

void ProgressBar::Update(uint64_t done, uint64_t total) {
  if (!enabled_) return;
  double now = Now();
  if (now - last_draw_ < 0.1 && done < total) return;
  last_draw_ = now;
  double fraction = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  double rate = done / std::max(1e-9, now - start_);
  double left = rate > 0 ? (static_cast<double>(total - done)) / rate : 0;
  const int width = 30;
  int filled = static_cast<int>(fraction * width);
  std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
  auto shown = [&](double n) { return unit_.empty() ? Human(n) : std::to_string(static_cast<uint64_t>(n)); };
  const std::string per = unit_.empty() ? "" : " " + unit_;
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %s / %s%s  %s%s/s  %.0fs left   ", label_.c_str(), bar.c_str(), fraction * 100,
               shown(done).c_str(), shown(total).c_str(), per.c_str(), shown(rate).c_str(), per.c_str(), left);
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace shardckpt::tools
