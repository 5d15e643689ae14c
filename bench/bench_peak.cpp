// Prints this machine's measured peaks (the denominators of every MFU and ratio we report).
#include "bench_common.h"

int main() {
  titan::bench::print_peak(titan::kernels::measure_machine_peak(0.5));
  return 0;
}
