#include "process_info.h"

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <sstream>

extern char** environ;

namespace anyattn_bench {

int64_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      int64_t kib = 0;
      if (fields >> kib) return kib * 1024;
    }
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

int64_t CurrentRssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t total_pages = 0;
  int64_t resident_pages = 0;
  if (!(statm >> total_pages >> resident_pages)) return -1;
  return resident_pages * sysconf(_SC_PAGESIZE);
}

std::string CpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

bool CpuInfoHasFlag(const std::string& flag) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    std::string word;
    while (words >> word) {
      if (word == flag) return true;
    }
    return false;
  }
  return false;
}

namespace {

// The size of the highest-level data or unified cache of CPU 0 in sysfs, or 0.
int64_t SysfsLastLevelCacheBytes() {
  int best_level = 0;
  int64_t best_bytes = 0;
  for (int index = 0; index < 16; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    std::ifstream level_file(dir + "/level"), type_file(dir + "/type"), size_file(dir + "/size");
    int level = 0;
    std::string type, size;
    if (!(level_file >> level) || !(type_file >> type) || !(size_file >> size)) continue;
    if (type != "Data" && type != "Unified") continue;
    // "32768K", "1024K", "2M" or a plain byte count.
    size_t digits = 0;
    while (digits < size.size() && size[digits] >= '0' && size[digits] <= '9') ++digits;
    if (digits == 0) continue;
    int64_t bytes = std::stoll(size.substr(0, digits));
    const std::string unit = size.substr(digits);
    if (unit == "K") {
      bytes <<= 10;
    } else if (unit == "M") {
      bytes <<= 20;
    } else if (unit == "G") {
      bytes <<= 30;
    } else if (!unit.empty()) {
      continue;
    }
    if (level > best_level) {
      best_level = level;
      best_bytes = bytes;
    }
  }
  return best_bytes;
}

}  // namespace

int64_t LibcLastLevelCacheBytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0) return l3;
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return l2 > 0 ? l2 : 0;
}

int64_t LastLevelCacheBytes() {
  const int64_t sysfs = SysfsLastLevelCacheBytes();
  return sysfs > 0 ? sysfs : LibcLastLevelCacheBytes();
}

double LoadAverage() {
  std::ifstream loadavg("/proc/loadavg");
  double one_minute = -1.0;
  loadavg >> one_minute;
  return one_minute;
}

std::string UtcTimestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

std::string RunSelf(const std::vector<std::string>& args, int* exit_code) {
  *exit_code = -1;
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return "";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
  std::vector<std::string> argv_storage = {"/proc/self/exe"};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_storage) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawn_error =
      posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  std::string output;
  if (spawn_error == 0) {
    char buffer[4096];
    ssize_t got;
    while ((got = read(pipe_fds[0], buffer, sizeof(buffer))) > 0) output.append(buffer, got);
  }
  close(pipe_fds[0]);
  if (spawn_error != 0) return "";
  int status = 0;
  if (waitpid(pid, &status, 0) == pid && WIFEXITED(status)) *exit_code = WEXITSTATUS(status);
  return output;
}

std::string TokenValue(const std::string& line, const std::string& key) {
  std::istringstream tokens(line);
  std::string token;
  const std::string prefix = key + "=";
  while (tokens >> token) {
    if (token.rfind(prefix, 0) == 0) return token.substr(prefix.size());
  }
  return "";
}

}  // namespace anyattn_bench
