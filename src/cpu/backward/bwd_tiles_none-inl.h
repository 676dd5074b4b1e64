// The backward's tile products on paths without AMX tiles: the names bwd_tiles_amx-inl.h defines,
// never called (tiles_on is false), so bwd_task is written once for every path.

constexpr uint8_t kKeySubnormal = 1;
constexpr uint8_t kValueSubnormal = 2;

inline bool tiles_on(const BwdLayout& /*layout*/) {
  return false;
}
inline void tiles_begin(const BwdLayout& /*layout*/) {}
inline void tiles_end(const BwdLayout& /*layout*/) {}
inline bool pack_key_words(const float* /*rows*/, int64_t /*n_pad*/, int64_t /*words*/,
                           float* /*staging*/, uint32_t* /*panel*/) {
  return true;
}
inline bool pack_query_words(const float* /*src*/, int64_t /*rows*/, int64_t /*n_pad*/,
                             int64_t /*words*/, uint32_t* /*dst*/) {
  return true;
}
inline void tile_products(int64_t /*head_dim*/, const uint32_t* /*a*/, int64_t /*rows*/,
                          const uint32_t* /*panel*/, float* /*out*/) {}
inline void pack_row_pairs(const float* /*rows*/, int64_t /*count*/, int64_t /*n_pad*/,
                           int64_t /*pairs*/, uint32_t* /*dst*/) {}
inline void split_transposed(float* /*tile*/, int64_t /*rows*/, float* /*dst*/) {}
inline void split_rows(const float* /*p*/, int64_t /*rows*/, void* /*dst*/) {}
inline void split_products(const void* /*a*/, int64_t /*row_groups*/, const uint32_t* /*b*/,
                           int64_t /*cols*/, int64_t /*chunks*/, float* /*c*/) {}
