#include <optional>
#include <sstream>
#include <vector>

#include "anyattn_runner.h"
#include "bench_cases.h"

namespace anyattn_bench {
namespace {

// The reference's shape of a pair on `shape`: f32 for kBf16VsF32, the same otherwise.
FwdShape ReferenceShape(PairKind kind, FwdShape shape) {
  if (kind == PairKind::kBf16VsF32) shape.dtype = DType::kF32;
  return shape;
}

// anyattn's thread count is process-wide: each call sets its own before running, and the case
// restores the caller's on the way out.
class ThreadCountRestorer {
 public:
  ThreadCountRestorer() : threads_(anyattn_get_num_threads()) {}
  ~ThreadCountRestorer() { anyattn_set_num_threads(threads_); }

 private:
  int threads_;
};

}  // namespace

std::string PairKey(PairKind kind, const FwdShape& shape, int threads) {
  // The forward key's tail after "fwd/<dtype>/": mask, batch, heads, head dim, lengths.
  const std::string fwd_key = FwdKey(shape);
  const std::string tail = fwd_key.substr(fwd_key.find('/', 4) + 1);
  std::ostringstream key;
  if (kind == PairKind::kBf16VsF32) {
    key << "pair/bf16-f32/thr" << threads << "/" << tail;
  } else {
    key << "pair/thr" << threads << "-thr1/" << DTypeName(shape.dtype) << "/" << tail;
  }
  return key.str();
}

PairRow RunPairCase(PairKind kind, const FwdShape& shape, int threads,
                    const CaseSettings& settings) {
  PairRow row;
  row.kind = kind;
  row.shape = shape;
  row.threads = threads;
  const ThreadCountRestorer restorer;

  const FwdBuffers subject_buffers(shape);
  // A thread pair runs both calls on the subject's buffers.
  std::optional<FwdBuffers> reference_buffers;
  if (kind == PairKind::kBf16VsF32) reference_buffers.emplace(ReferenceShape(kind, shape));
  const FwdBuffers& reference_inputs = reference_buffers ? *reference_buffers : subject_buffers;
  if (!subject_buffers.ok() || !reference_inputs.ok()) {
    row.error = "benchmark could not allocate the inputs";
    return row;
  }
  const AnyattnFwdCall subject_call = subject_buffers.Call(settings.isa);
  const AnyattnFwdCall reference_call = reference_inputs.Call(settings.isa);
  const int reference_threads = kind == PairKind::kBf16VsF32 ? threads : 1;

  InterleavedRun subject;
  subject.run = [&] {
    anyattn_set_num_threads(threads);
    return subject_call.Run(&row.error);
  };
  InterleavedRun reference;
  reference.run = [&] {
    anyattn_set_num_threads(reference_threads);
    return reference_call.Run(&row.error);
  };
  const std::vector<std::optional<TimingResult>> timed =
      TimeInterleaved({subject, reference}, settings.policy);
  row.subject = timed[0];
  row.reference = timed[1];
  return row;
}

}  // namespace anyattn_bench
