#include "gpu_monitor.hpp"

#include <dlfcn.h>

#include <chrono>

namespace snapmla::cli {
namespace {

// The few NVML entry points used (nvml.h is not needed: handles are opaque pointers, return
// codes unsigned, 0 = success). NVML_CLOCK_SM = 1; clocks-event reason bit 0x4 = software power cap.
using InitFn = unsigned (*)();
using ShutdownFn = unsigned (*)();
using ByPciFn = unsigned (*)(const char*, void**);
using ClockFn = unsigned (*)(void*, int, unsigned*);
using ReasonsFn = unsigned (*)(void*, unsigned long long*);
constexpr int kClockSm = 1;
constexpr unsigned long long kSwPowerCap = 0x4;

}  // namespace

GpuMonitor::GpuMonitor(const char* pci_bus_id, int period_us) {
  lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib_ == nullptr) return;
  auto init = reinterpret_cast<InitFn>(dlsym(lib_, "nvmlInit_v2"));
  auto by_pci = reinterpret_cast<ByPciFn>(dlsym(lib_, "nvmlDeviceGetHandleByPciBusId_v2"));
  clock_info_ = reinterpret_cast<ClockFn>(dlsym(lib_, "nvmlDeviceGetClockInfo"));
  reasons_ = reinterpret_cast<ReasonsFn>(dlsym(lib_, "nvmlDeviceGetCurrentClocksEventReasons"));
  if (reasons_ == nullptr) reasons_ = reinterpret_cast<ReasonsFn>(dlsym(lib_, "nvmlDeviceGetCurrentClocksThrottleReasons"));
  const bool inited = init != nullptr && init() == 0;
  void* dev = nullptr;
  if (!inited || by_pci == nullptr || clock_info_ == nullptr || by_pci(pci_bus_id, &dev) != 0 || dev == nullptr) {
    if (inited) {
      if (auto shutdown = reinterpret_cast<ShutdownFn>(dlsym(lib_, "nvmlShutdown"))) shutdown();
    }
    dlclose(lib_);
    lib_ = nullptr;
    return;
  }
  device_ = dev;
  thread_ = std::thread([this, period_us] { run(period_us); });
}

GpuMonitor::~GpuMonitor() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (lib_ != nullptr) {
    if (auto shutdown = reinterpret_cast<ShutdownFn>(dlsym(lib_, "nvmlShutdown"))) shutdown();
    dlclose(lib_);
  }
}

void GpuMonitor::run(int period_us) {
  auto next = std::chrono::steady_clock::now();
  while (!stop_) {
    unsigned mhz = 0;
    unsigned long long why = 0;
    if (clock_info_(device_, kClockSm, &mhz) == 0) {
      const bool capped = reasons_ != nullptr && reasons_(device_, &why) == 0 && (why & kSwPowerCap) != 0;
      std::lock_guard<std::mutex> lock(mu_);
      samples_.push_back({mhz, capped});
    }
    next += std::chrono::microseconds(period_us);
    std::this_thread::sleep_until(next);
  }
}

size_t GpuMonitor::mark() {
  std::lock_guard<std::mutex> lock(mu_);
  return samples_.size();
}

GpuMonitor::Stats GpuMonitor::stats_since(size_t mark) {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  for (size_t i = mark; i < samples_.size(); ++i) {
    s.sm_mhz += samples_[i].sm_mhz;
    s.power_capped += samples_[i].power_capped ? 1 : 0;
    ++s.samples;
  }
  if (s.samples > 0) {
    s.sm_mhz /= s.samples;
    s.power_capped /= s.samples;
  }
  return s;
}

}  // namespace snapmla::cli
