// Resource limits (docs/reliability.md, "Resource limits"): a workspace that cannot be allocated
// is reported as ANYATTN_E_OUT_OF_MEMORY with nothing written, the thread pool survives fork()
// (also while another thread is inside a call) and shuts down cleanly at exit.
//
// Each scenario runs in a forked child so that an abort, a hang or an address-space limit cannot
// take the test binary down: the child reports through its exit status and is killed by alarm()
// if it hangs.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/test_support.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ANYATTN_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ANYATTN_TEST_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define ANYATTN_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ANYATTN_TEST_TSAN 1
#endif
#endif

// Under ASan/TSan a request beyond the allocator's limit (1 TiB) must return null, as malloc does,
// instead of aborting the process: that is what a production allocator does and what the library
// must handle. The environment's ASAN_OPTIONS/TSAN_OPTIONS are applied on top of these defaults.
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1";
}
extern "C" const char* __tsan_default_options() {
  return "allocator_may_return_null=1";
}

namespace anyattn {
namespace testing {
namespace {

// Runs `body` in a forked child with a `seconds` alarm and returns its exit code (128 + signal if
// it was killed).
template <class Body>
int run_in_child(int seconds, Body body) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(static_cast<unsigned>(seconds));
    std::_Exit(body());
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

// The process's current virtual size in bytes (from /proc/self/statm), or 0 if unknown.
[[maybe_unused]] uint64_t virtual_size() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  statm >> pages;
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// A request that validates and then needs about 4 TiB of packed K/V workspace: Sk = 2^31 - 1 keys
// of head dim 256, all the same row (k and v have stride 0 over keys), and more query rows (65)
// than the streaming path takes (64), so the keys are packed.
struct HugeRequest {
  static constexpr int64_t kSq = 65, kSk = (int64_t{1} << 31) - 1, kD = 256;
  std::vector<float> q = std::vector<float>(kSq * kD, 0.5f);
  std::vector<float> kv = std::vector<float>(kD, 0.25f);
  std::vector<float> out = std::vector<float>(kSq * kD, 7.0f);
  std::vector<float> lse = std::vector<float>(kSq, 7.0f);
  anyattn_tensor tq{}, tk{}, tv{}, tout{}, tlse{};

  HugeRequest() {
    const int64_t q_shape[4] = {1, kSq, 1, kD};
    const int64_t lse_shape[3] = {1, 1, kSq};
    anyattn_tensor_init_contiguous(&tq, q.data(), ANYATTN_DTYPE_F32, 4, q_shape);
    anyattn_tensor_init_contiguous(&tout, out.data(), ANYATTN_DTYPE_F32, 4, q_shape);
    anyattn_tensor_init_contiguous(&tlse, lse.data(), ANYATTN_DTYPE_F32, 3, lse_shape);
    tk = tq;
    tk.data = kv.data();
    tk.shape[1] = kSk;
    tk.strides[0] = tk.strides[1] = tk.strides[2] = 0;
    tv = tk;
  }
  anyattn_status run() const { return anyattn_fwd(&tq, &tk, &tv, &tout, &tlse, nullptr); }
  bool outputs_untouched() const {
    for (float x : out) {
      if (x != 7.0f) return false;
    }
    for (float x : lse) {
      if (x != 7.0f) return false;
    }
    return true;
  }
};

// Exit codes of the OOM child, for readable failures.
enum OomResult { kOomOk = 0, kWrongStatus = 10, kNoMessage, kOutputsWritten, kLaterCallFailed };

int oom_child(int threads) {
#if !defined(ANYATTN_TEST_SANITIZED)
  // Leave 1 GiB of address space above what the process uses now: the workspace cannot fit.
  const uint64_t limit = virtual_size() + (uint64_t{1} << 30);
  const struct rlimit rl = {limit, limit};
  if (setrlimit(RLIMIT_AS, &rl) != 0) return 20;
#endif
  anyattn_set_num_threads(threads);
  HugeRequest request;
  const anyattn_status status = request.run();
  if (status != ANYATTN_E_OUT_OF_MEMORY) {
    std::fprintf(stderr, "status %s: %s\n", anyattn_status_name(status), anyattn_last_error());
    return kWrongStatus;
  }
  if (std::strlen(anyattn_last_error()) == 0) return kNoMessage;
  if (!request.outputs_untouched()) return kOutputsWritten;
  // The failed call released the pool and left no state behind: a normal call still works.
  Case c;
  c.Sq = c.Sk = 70;
  c.Hq = 2;
  Problem p(c);
  if (p.run() != ANYATTN_OK || !check_outputs(p, p.reference(), p.naive_same_dtype())) {
    return kLaterCallFailed;
  }
  return kOomOk;
}

TEST(ReliabilityResources, UnallocatableWorkspaceReturnsOutOfMemory) {
  for (int threads : {1, 2}) {
    EXPECT_EQ(run_in_child(120, [threads] { return oom_child(threads); }), kOomOk)
        << "threads=" << threads;
  }
}

// A problem computed in the parent and again in a child must give the same bytes.
struct ForkCase {
  Case c;
  std::vector<unsigned char> expected;
  ForkCase() {
    c.B = 2;
    c.Sq = 130;
    c.Sk = 200;
    c.Hq = 4;
    c.Hk = 2;
    c.causal = true;
    Problem p(c);
    EXPECT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    expected = p.output_bytes();
  }
  // 0 when a fresh run matches `expected`, else 1.
  int rerun() const {
    Problem p(c);
    if (p.run() != ANYATTN_OK) return 1;
    return p.output_bytes() == expected ? 0 : 1;
  }
};

TEST(ReliabilityResources, ChildProcessCanCallAfterForkAndExitCleanly) {
#if defined(ANYATTN_TEST_TSAN)
  GTEST_SKIP() << "ThreadSanitizer does not support starting threads after a multithreaded fork";
#endif
  anyattn_set_num_threads(4);  // The parent's pool has worker threads before the fork.
  const ForkCase fork_case;
  for (int threads : {1, 4}) {
    // The child uses the library, then leaves through exit() so static destructors (the pool's
    // shutdown) and, under ASan, LeakSanitizer run in the child.
    const pid_t pid = [&] {
      std::fflush(nullptr);
      return fork();
    }();
    if (pid == 0) {
      alarm(60);
      anyattn_set_num_threads(threads);
      const int rc = fork_case.rerun() | fork_case.rerun();
      std::exit(rc);
    }
    ASSERT_GT(pid, 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "threads=" << threads;
  }
  EXPECT_EQ(fork_case.rerun(), 0);  // The parent's pool still works.
  anyattn_set_num_threads(0);
}

TEST(ReliabilityResources, ForkWhileAnotherThreadIsInsideACall) {
#if defined(ANYATTN_TEST_TSAN)
  GTEST_SKIP() << "ThreadSanitizer does not support starting threads after a multithreaded fork";
#endif
  anyattn_set_num_threads(2);
  const ForkCase fork_case;
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0}, calls{0};
  std::thread busy([&] {
    while (!stop.load()) {
      failures += fork_case.rerun();
      ++calls;
    }
  });
  while (calls.load() == 0) std::this_thread::yield();
  for (int round = 0; round < 4; ++round) {
    // The child inherits whatever state the pool was in (a lease held, workers mid-task) but
    // none of the parent's threads; it must still be able to call, with the pool, and exit.
    const int rc = run_in_child(60, [&] {
      anyattn_set_num_threads(2);
      return fork_case.rerun() | fork_case.rerun();
    });
    EXPECT_EQ(rc, 0) << "round " << round;
  }
  stop = true;
  busy.join();
  EXPECT_EQ(failures.load(), 0);
  anyattn_set_num_threads(0);
}

// A process that used a multi-threaded pool returns from main (static destructors join the
// workers) without hanging or crashing.
TEST(ReliabilityResources, ProcessExitsCleanlyAfterUsingThePool) {
#if defined(ANYATTN_TEST_TSAN)
  GTEST_SKIP() << "ThreadSanitizer does not support starting threads after a multithreaded fork";
#endif
  const ForkCase fork_case;
  for (int threads : {2, 8}) {
    const pid_t pid = [] {
      std::fflush(nullptr);
      return fork();
    }();
    if (pid == 0) {
      alarm(60);
      anyattn_set_num_threads(threads);
      const int rc = fork_case.rerun();
      std::exit(rc);  // Runs the pool's destructor with `threads - 1` workers waiting.
    }
    ASSERT_GT(pid, 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "threads=" << threads;
  }
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
