// Facts about this process and machine that the report records: memory use, CPU model, caches.
#ifndef ANYATTN_BENCH_PROCESS_INFO_H_
#define ANYATTN_BENCH_PROCESS_INFO_H_

#include <cstdint>
#include <string>
#include <vector>

namespace anyattn_bench {

// High-water mark of this process's resident set in bytes: VmHWM of /proc/self/status, which
// starts afresh at exec, else getrusage's ru_maxrss. (Linux carries ru_maxrss across execve, and
// posix_spawn's child starts from its parent's high-water mark, so a spawned child's ru_maxrss
// would report the parent's peak.)
int64_t PeakRssBytes();

// Current resident set in bytes (/proc/self/statm), or -1 where unavailable.
int64_t CurrentRssBytes();

// The "model name" line of /proc/cpuinfo, or "unknown".
std::string CpuModelName();

// True when /proc/cpuinfo lists the flag `flag` (e.g. "avx512f").
bool CpuInfoHasFlag(const std::string& flag);

// Size in bytes of the last-level cache that CPU 0 sees: the highest-level data or unified cache
// in /sys/devices/system/cpu/cpu0/cache, else what the C library reports, else 0. sysfs first
// because glibc can report the sum over all of a socket's caches: on an AMD EPYC VM (Zen 5) it
// gave 384 MiB where each core shares a 32 MiB L3.
int64_t LastLevelCacheBytes();

// The last-level cache size the C library reports (sysconf), or 0 if unknown.
int64_t LibcLastLevelCacheBytes();

// The 1-minute load average (/proc/loadavg), or -1 where unavailable.
double LoadAverage();

// The current UTC time as "YYYY-MM-DDTHH:MM:SSZ".
std::string UtcTimestamp();

// Runs this executable (/proc/self/exe) with `args` and the current environment, waits for it,
// and returns its standard output; its standard error goes to ours. *exit_code receives the exit
// status (or -1 when it could not be started or did not exit normally).
std::string RunSelf(const std::vector<std::string>& args, int* exit_code);

// Value of `key` in a line of "key=value" tokens separated by spaces, or "" if absent.
std::string TokenValue(const std::string& line, const std::string& key);

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_PROCESS_INFO_H_
