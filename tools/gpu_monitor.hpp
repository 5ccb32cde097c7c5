// The SM clock a benchmark ran at, sampled through NVML while it runs. Under sustained decode
// load an H200 sits at its 700 W limit and the SM clock falls from 1980 MHz to 1.3-1.8 GHz
// depending on the kernel's mix (docs/design.md, performance model), so a time without the clock it was
// measured at is half a result. NVML reports the clock the driver has set, which moves in steps
// tens of milliseconds apart and lags the clock the SMs actually run: a 0.15 s bench read 1980 MHz
// with no cap, where clock64 over the global timer inside the same kind of run measured 1.74-1.76
// GHz (docs/archive/kernel_history.md). So use it over seconds - a pass of the benchmark grid - as the
// power state the pass ran in, not as a cycle count (the clock of single calls was measured
// with clock64 stamps inside the kernels). NVML is loaded at run time (dlopen): the tools build and run where
// there is no driver, and then report no clock.
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

namespace snapmla::cli {

class GpuMonitor {
 public:
  // Samples the GPU with PCI bus id `pci_bus_id` (cudaDeviceGetPCIBusId: NVML's device indices
  // need not follow CUDA_VISIBLE_DEVICES) every `period_us` microseconds on a thread of its own,
  // from construction to destruction, if NVML and the device are found.
  explicit GpuMonitor(const char* pci_bus_id, int period_us = 1000);
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  bool available() const { return device_ != nullptr; }

  struct Stats {
    int samples = 0;
    double sm_mhz = 0;       // mean SM clock over the samples
    double power_capped = 0;  // share of samples with the software power cap holding the clock down
  };
  // A point in the sample stream; stats_since(mark()) covers what was sampled after it.
  size_t mark();
  Stats stats_since(size_t mark);

 private:
  struct Sample {
    unsigned sm_mhz;
    bool power_capped;
  };
  void run(int period_us);

  void* lib_ = nullptr;
  void* device_ = nullptr;
  unsigned (*clock_info_)(void*, int, unsigned*) = nullptr;
  unsigned (*reasons_)(void*, unsigned long long*) = nullptr;
  std::mutex mu_;
  std::vector<Sample> samples_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace snapmla::cli
