#include "shapes.h"

#include <algorithm>
#include <sstream>

namespace anyattn_bench {

int64_t VisiblePairs(int64_t seqlen_q, int64_t seqlen_k, bool causal) {
  if (!causal) return seqlen_q * seqlen_k;
  int64_t pairs = 0;
  for (int64_t i = 0; i < seqlen_q; ++i) {
    const int64_t last_visible = i + seqlen_k - seqlen_q;
    pairs += std::clamp<int64_t>(last_visible + 1, 0, seqlen_k);
  }
  return pairs;
}

double FwdFlops(const FwdShape& shape) {
  return 4.0 * shape.batch * shape.heads_q * shape.head_dim *
         static_cast<double>(VisiblePairs(shape.seqlen_q, shape.seqlen_k, shape.causal));
}

double BwdFlops(const FwdShape& shape) {
  return 2.5 * FwdFlops(shape);
}

namespace {

// "S2048" when Sq == Sk, else "Sq1/Sk4096".
std::string SeqlenText(int64_t seqlen_q, int64_t seqlen_k) {
  std::ostringstream text;
  if (seqlen_q == seqlen_k) {
    text << "S" << seqlen_q;
  } else {
    text << "Sq" << seqlen_q << "/Sk" << seqlen_k;
  }
  return text.str();
}

// Row key of a dense call on `shape` under `prefix`, e.g. "fwd/f32/causal/B1/Hq16/Hk4/D128/S2048".
std::string DenseKey(const char* prefix, const FwdShape& shape) {
  std::ostringstream key;
  key << prefix << "/" << DTypeName(shape.dtype) << "/" << (shape.causal ? "causal" : "full")
      << "/B" << shape.batch << "/Hq" << shape.heads_q << "/Hk" << shape.heads_k << "/D"
      << shape.head_dim << "/" << SeqlenText(shape.seqlen_q, shape.seqlen_k);
  return key.str();
}

}  // namespace

std::string FwdKey(const FwdShape& shape) {
  return DenseKey("fwd", shape);
}

std::string BwdKey(const FwdShape& shape) {
  return DenseKey("bwd", shape);
}

std::string FwdLabel(const FwdShape& shape) {
  std::ostringstream label;
  label << "B" << shape.batch << " H" << shape.heads_q << "/" << shape.heads_k << " D"
        << shape.head_dim << " " << SeqlenText(shape.seqlen_q, shape.seqlen_k);
  return label.str();
}

std::vector<FwdShape> ForwardTableShapes(bool quick) {
  const std::vector<DType> dtypes = {DType::kF32, DType::kBf16};
  const std::vector<int64_t> kv_heads =
      quick ? std::vector<int64_t>{4} : std::vector<int64_t>{16, 4};
  const std::vector<int64_t> head_dims = {64, 128};
  const std::vector<bool> masks = {false, true};
  const std::vector<int64_t> seqlens =
      quick ? std::vector<int64_t>{1024, 2048} : std::vector<int64_t>{512, 1024, 2048, 4096, 8192};
  std::vector<FwdShape> shapes;
  for (DType dtype : dtypes) {
    for (int64_t heads_k : kv_heads) {
      for (int64_t head_dim : head_dims) {
        for (bool causal : masks) {
          for (int64_t seqlen : seqlens) {
            FwdShape shape;
            shape.heads_k = heads_k;
            shape.head_dim = head_dim;
            shape.causal = causal;
            shape.dtype = dtype;
            shape.seqlen_q = shape.seqlen_k = seqlen;
            shapes.push_back(shape);
          }
        }
      }
    }
  }
  return shapes;
}

std::vector<FwdShape> BackwardTableShapes(bool quick) {
  const std::vector<int64_t> seqlens =
      quick ? std::vector<int64_t>{2048} : std::vector<int64_t>{1024, 2048, 4096};
  std::vector<FwdShape> shapes;
  for (DType dtype : {DType::kF32, DType::kBf16}) {
    for (int64_t head_dim : {64, 128}) {
      for (bool causal : {false, true}) {
        for (int64_t seqlen : seqlens) {
          FwdShape shape;
          shape.heads_q = shape.heads_k = 16;
          shape.head_dim = head_dim;
          shape.causal = causal;
          shape.dtype = dtype;
          shape.seqlen_q = shape.seqlen_k = seqlen;
          shapes.push_back(shape);
        }
      }
    }
  }
  return shapes;
}

const char* CacheFormatName(CacheFormat cache) {
  switch (cache) {
    case CacheFormat::kFp8E4M3:
      return "e4m3";
    case CacheFormat::kI8PerToken:
      return "i8tok";
    case CacheFormat::kAsQ:
    default:
      return "";
  }
}

double DecodeKvBytes(const DecodeShape& shape) {
  const int64_t columns =
      shape.shared_latent ? shape.head_dim : shape.head_dim + shape.value_head_dim();
  const double positions = 1.0 * shape.batch * shape.seqlen_k * shape.heads_k;
  switch (shape.cache) {
    case CacheFormat::kFp8E4M3:
      return positions * columns;
    case CacheFormat::kI8PerToken:  // and one f32 token scale per row of K and of V
      return positions * (columns + (shape.shared_latent ? 4 : 8));
    case CacheFormat::kAsQ:
    default:
      return positions * columns * DTypeBytes(shape.dtype);
  }
}

std::string DecodeKey(const DecodeShape& shape) {
  std::ostringstream key;
  if (shape.seqlen_q > 1) {
    key << "prefill" << shape.seqlen_q << "/";
  } else {
    key << "decode/";
  }
  key << DTypeName(shape.dtype) << "/B" << shape.batch << "/Hq" << shape.heads_q << "/Hk"
      << shape.heads_k << "/D" << shape.head_dim;
  if (shape.value_head_dim() != shape.head_dim) key << "/Dv" << shape.value_head_dim();
  key << "/Sk" << shape.seqlen_k;
  if (shape.page_size > 0) key << "/page" << shape.page_size;
  if (shape.shared_latent) key << "/latent";
  if (shape.cache != CacheFormat::kAsQ) key << "/kv_" << CacheFormatName(shape.cache);
  return key.str();
}

std::string DecodeLabel(const DecodeShape& shape) {
  std::ostringstream label;
  if (shape.seqlen_q > 1) label << "Sq" << shape.seqlen_q << " ";
  label << "B" << shape.batch << " H" << shape.heads_q << "/" << shape.heads_k << " D"
        << shape.head_dim;
  if (shape.value_head_dim() != shape.head_dim) label << "/" << shape.value_head_dim();
  label << " Sk" << shape.seqlen_k;
  if (shape.page_size > 0) label << " pg" << shape.page_size;
  if (shape.cache != CacheFormat::kAsQ) label << " " << CacheFormatName(shape.cache);
  if (shape.shared_latent) label << " latent";
  return label.str();
}

std::vector<DecodeShape> DecodeTableShapes(bool quick) {
  std::vector<DecodeShape> shapes;
  for (DType dtype : {DType::kBf16, DType::kF16, DType::kF32}) {
    for (int64_t batch : quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 8}) {
      for (int64_t seqlen_k : {4096, 32768}) {
        // Dense, then paged caches of 16 and 256 keys per page (issue 5's decode shapes).
        for (int64_t page_size : {0, 16, 256}) {
          DecodeShape shape;
          shape.batch = batch;
          shape.seqlen_k = seqlen_k;
          shape.dtype = dtype;
          shape.page_size = page_size;
          shapes.push_back(shape);
          if (dtype != DType::kBf16 || page_size > 16) continue;
          for (CacheFormat cache : {CacheFormat::kFp8E4M3, CacheFormat::kI8PerToken}) {
            shape.cache = cache;
            shapes.push_back(shape);
          }
        }
      }
    }
  }
  for (CacheFormat cache : {CacheFormat::kAsQ, CacheFormat::kFp8E4M3, CacheFormat::kI8PerToken}) {
    DecodeShape shape;
    shape.seqlen_q = 512;
    shape.seqlen_k = 4096;
    shape.cache = cache;
    shapes.push_back(shape);
  }
  // Absorbed MLA decode (DeepSeek-V2-Lite's 16 heads): one latent kv head of 512 + 64 dims, read
  // once as K and V, in bf16 and as 8-bit latent caches (V with K's scales), and the same call
  // with V in a buffer of its own (what reading it twice costs).
  DecodeShape mla;
  mla.heads_q = 16;
  mla.heads_k = 1;
  mla.head_dim = 576;
  mla.head_dim_v = 512;
  mla.seqlen_k = 32768;
  mla.page_size = 64;
  mla.shared_latent = true;
  for (CacheFormat cache : {CacheFormat::kAsQ, CacheFormat::kFp8E4M3, CacheFormat::kI8PerToken}) {
    DecodeShape shape = mla;
    shape.cache = cache;
    shapes.push_back(shape);
  }
  DecodeShape separate_v = mla;
  separate_v.shared_latent = false;
  shapes.push_back(separate_v);
  // The same with DeepSeek-V3's 128 query heads on the latent head: more rows than one task
  // holds, so the packed path runs tasks of 64 heads.
  DecodeShape wide_mla = mla;
  wide_mla.heads_q = 128;
  shapes.push_back(wide_mla);
  return shapes;
}

bool IsMlaDecode(const DecodeShape& shape) {
  return shape.shared_latent || shape.value_head_dim() != shape.head_dim;
}

bool MatchesFilter(const std::string& key, const std::string& filter) {
  std::istringstream terms(filter);
  std::string term;
  while (std::getline(terms, term, ',')) {
    if (!term.empty() && key.find(term) == std::string::npos) return false;
  }
  return true;
}

bool MatchesAnyFilter(const std::string& key, const std::vector<std::string>& filters) {
  if (filters.empty()) return true;
  for (const std::string& filter : filters) {
    if (MatchesFilter(key, filter)) return true;
  }
  return false;
}

}  // namespace anyattn_bench
