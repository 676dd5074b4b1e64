//! Index tensors (cumulative sequence lengths, block tables, prefix ranges) read on the host
//! as i32, with errors that name the tensor and the entry.

use candle_core::{bail, DType, Result, Tensor};

/// Reads cumulative sequence lengths (u32, i32 or i64, rank 1) as i32.
pub(crate) fn read_seqlens(name: &str, t: &Tensor) -> Result<Vec<i32>> {
    if t.rank() != 1 {
        bail!(
            "flash-attn (anyattn): {name} must have rank 1 (batch + 1), got shape {:?}",
            t.dims()
        )
    }
    read_i32(name, t)
}

/// Reads an index tensor (u32, i32 or i64, any rank, any device) as row-major i32 values.
pub(crate) fn read_i32(name: &str, t: &Tensor) -> Result<Vec<i32>> {
    let t = t.flatten_all()?;
    let wide: Vec<i64> = match t.dtype() {
        DType::U32 => t.to_vec1::<u32>()?.into_iter().map(i64::from).collect(),
        DType::I32 => t.to_vec1::<i32>()?.into_iter().map(i64::from).collect(),
        DType::I64 => t.to_vec1::<i64>()?,
        dt => bail!("flash-attn (anyattn): {name} must be u32, i32 or i64, got {dt:?}"),
    };
    wide.into_iter()
        .enumerate()
        .map(|(i, x)| {
            i32::try_from(x).map_err(|_| {
                candle_core::Error::Msg(format!(
                    "flash-attn (anyattn): {name}[{i}] = {x} is outside int32"
                ))
            })
        })
        .collect()
}

/// Per-sequence key counts from cumulative offsets: non-decreasing, each at most `max_seqlen_k`.
pub(crate) fn key_counts(cu_k: &[i32], max_seqlen_k: usize) -> Result<Vec<i32>> {
    cu_k.windows(2)
        .enumerate()
        .map(|(b, w)| {
            let n = i64::from(w[1]) - i64::from(w[0]);
            if n < 0 || n as u64 > max_seqlen_k as u64 {
                bail!(
                    "flash-attn (anyattn): seqlens_k gives sequence {b} {n} keys \
                     (seqlens_k[{}] = {}, seqlens_k[{b}] = {}); supported 0 to max_seqlen_k = \
                     {max_seqlen_k}",
                    b + 1,
                    w[1],
                    w[0]
                )
            }
            Ok(n as i32)
        })
        .collect()
}
