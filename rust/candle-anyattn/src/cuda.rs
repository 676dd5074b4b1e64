//! The CUDA route (feature `cuda`): CUDA tensors go to candle-flash-attn 0.11.1's kernels, with
//! the same arguments. Sinks have no CUDA kernel there and are an error for CUDA tensors.
//!
//! The page gathering used for page sizes its paged kernel does not take is plain candle and is
//! tested on the CPU.

use candle_core::{bail, Result, Tensor};

use crate::indices::{key_counts, read_i32, read_seqlens};

#[cfg(feature = "cuda")]
use crate::ops::{FlashAttn, FlashAttnSinks, FlashAttnVarLen, FlashAttnVarLenPaged};
#[cfg(feature = "cuda")]
use candle_core::{CudaStorage, Layout, Shape};

/// An op's computation on CUDA storage, called by its `CustomOp3::cuda_fwd`.
#[cfg(feature = "cuda")]
pub(crate) trait CudaRoute {
    #[allow(clippy::too_many_arguments)]
    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        q_l: &Layout,
        k: &CudaStorage,
        k_l: &Layout,
        v: &CudaStorage,
        v_l: &Layout,
    ) -> Result<(CudaStorage, Shape)>;
}

#[cfg(feature = "cuda")]
impl CudaRoute for FlashAttn {
    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        q_l: &Layout,
        k: &CudaStorage,
        k_l: &Layout,
        v: &CudaStorage,
        v_l: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let op = candle_flash_attn::FlashAttn {
            softmax_scale: self.softmax_scale,
            alibi_slopes: self.alibi_slopes.clone(),
            window_size_left: self.window_size_left,
            window_size_right: self.window_size_right,
            softcap: self.softcap,
        };
        candle_core::CustomOp3::cuda_fwd(&op, q, q_l, k, k_l, v, v_l)
    }
}

/// The ops whose CUDA tensors are routed before the op is applied (or not at all): their
/// `cuda_fwd` only says where CUDA tensors go.
#[cfg(feature = "cuda")]
macro_rules! no_cuda_op {
    ($op:ty, $message:literal) => {
        impl CudaRoute for $op {
            fn cuda_fwd(
                &self,
                _: &CudaStorage,
                _: &Layout,
                _: &CudaStorage,
                _: &Layout,
                _: &CudaStorage,
                _: &Layout,
            ) -> Result<(CudaStorage, Shape)> {
                bail!($message)
            }
        }
    };
}

#[cfg(feature = "cuda")]
no_cuda_op!(
    FlashAttnSinks,
    "flash-attn-sinks: candle-flash-attn has no sinks, so CUDA tensors are not supported; move them to the CPU"
);
#[cfg(feature = "cuda")]
no_cuda_op!(
    FlashAttnVarLen,
    "flash-attn-varlen: CUDA tensors are handled by the candle_anyattn::flash_attn_varlen* functions (through candle-flash-attn), not by this op"
);
#[cfg(feature = "cuda")]
no_cuda_op!(
    FlashAttnVarLenPaged,
    "flash-attn-varlen-paged: CUDA tensors are handled by candle_anyattn::flash_attn_varlen_paged_windowed (through candle-flash-attn), not by this op"
);

/// The varlen functions' CUDA route: candle-flash-attn's most general varlen function.
#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: Option<f32>,
    sinks: Option<&Tensor>,
) -> Result<Tensor> {
    if sinks.is_some() {
        bail!("flash-attn-varlen-sinks: candle-flash-attn has no sinks, so CUDA tensors are not supported; move them to the CPU")
    }
    candle_flash_attn::flash_attn_varlen_alibi_windowed_softcap(
        q,
        k,
        v,
        alibi_slopes,
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_size_left,
        window_size_right,
        softcap.unwrap_or(0.0),
    )
}

/// The paged varlen's CUDA route: candle-flash-attn's paged kernel when the page size is a
/// multiple of 32 (what it takes), else the pages gathered and its varlen kernel (no
/// `mm_prefix_ranges` there).
#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn varlen_paged(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    block_table: &Tensor,
    mm_prefix_ranges: Option<&Tensor>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    page_block_size: usize,
    softcap: Option<f32>,
) -> Result<Tensor> {
    if page_block_size % 32 == 0 {
        return candle_flash_attn::flash_attn_varlen_paged_windowed(
            q,
            k,
            v,
            seqlens_q,
            seqlens_k,
            block_table,
            mm_prefix_ranges,
            max_seqlen_q,
            max_seqlen_k,
            softmax_scale,
            window_size_left,
            window_size_right,
            page_block_size,
            softcap,
        );
    }
    if mm_prefix_ranges.is_some() {
        bail!("flash-attn (anyattn): mm_prefix_ranges on CUDA tensors needs a page_block_size that is a multiple of 32 (candle-flash-attn's paged kernel), got {page_block_size}; move the tensors to the CPU or use such a page size")
    }
    let (flat_k, flat_v, cu_k) =
        gather_pages(k, v, seqlens_k, block_table, max_seqlen_k, page_block_size)?;
    varlen(
        q,
        &flat_k,
        &flat_v,
        None,
        seqlens_q,
        &cu_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_size_left,
        window_size_right,
        softcap,
        None,
    )
}

/// Gathers each sequence's keys and values from the paged caches into packed `(total_k, H, D)`
/// tensors on the caches' device, with the cumulative key offsets `(batch + 1)` u32: the CUDA
/// route for page sizes candle-flash-attn's paged kernel does not take.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn gather_pages(
    k: &Tensor,
    v: &Tensor,
    seqlens_k: &Tensor,
    block_table: &Tensor,
    max_seqlen_k: usize,
    page_block_size: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (num_blocks, page, hk, d) = k.dims4()?;
    if page != page_block_size {
        bail!("flash-attn (anyattn): page_block_size is {page_block_size} but the key cache has {page} positions per block")
    }
    let lens = key_counts(&read_seqlens("seqlens_k", seqlens_k)?, max_seqlen_k)?;
    let (batch, max_blocks) = block_table.dims2()?;
    let table = read_i32("block_table", block_table)?;
    if lens.len() != batch {
        bail!(
            "flash-attn (anyattn): block_table has {batch} rows, seqlens_k gives {} sequences",
            lens.len()
        )
    }
    let mut rows = Vec::new();
    for (b, &n) in lens.iter().enumerate() {
        for p in 0..n as usize {
            let block = p / page;
            let entry = table
                .get(b * max_blocks + block)
                .copied()
                .filter(|_| block < max_blocks);
            match entry {
                Some(e) if e >= 0 && (e as usize) < num_blocks => rows.push((e as usize * page + p % page) as u32),
                _ => bail!("flash-attn (anyattn): block_table[{b}][{block}] is {entry:?}; supported 0 to {} for the {n} keys of sequence {b}", num_blocks as i64 - 1),
            }
        }
    }
    let mut cu: Vec<u32> = vec![0];
    for &n in &lens {
        cu.push(cu.last().copied().unwrap_or(0) + n as u32);
    }
    let index = Tensor::new(rows.as_slice(), k.device())?;
    let flat_k = k
        .reshape((num_blocks * page, hk, d))?
        .index_select(&index, 0)?;
    let dv = v.dims4()?.3;
    let flat_v = v
        .reshape((num_blocks * page, hk, dv))?
        .index_select(&index, 0)?;
    Ok((flat_k, flat_v, Tensor::new(cu.as_slice(), k.device())?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{flash_attn_varlen, flash_attn_varlen_paged_windowed};
    use candle_core::Device;

    /// The gather route (used for CUDA tensors) reads exactly the keys the native paged op reads:
    /// on CPU tensors, varlen over the gathered keys equals the paged op.
    #[test]
    fn gathered_pages_give_the_paged_result() -> Result<()> {
        let dev = &Device::Cpu;
        let (blocks, page, hk, d) = (6, 3, 2, 8);
        let k = Tensor::randn(0f32, 1., (blocks, page, hk, d), dev)?;
        let v = Tensor::randn(0f32, 1., (blocks, page, hk, d), dev)?;
        let q = Tensor::randn(0f32, 1., (6, 4, d), dev)?;
        let seqlens_q = Tensor::new(&[0u32, 1, 6], dev)?;
        let seqlens_k = Tensor::new(&[0u32, 4, 12], dev)?;
        let table = Tensor::new(&[[5u32, 0, 0], [2, 4, 1]], dev)?;
        let paged = flash_attn_varlen_paged_windowed(
            &q,
            &k,
            &v,
            &seqlens_q,
            &seqlens_k,
            &table,
            None,
            5,
            8,
            0.3,
            None,
            Some(0),
            page,
            None,
        )?;
        let (flat_k, flat_v, cu_k) = gather_pages(&k, &v, &seqlens_k, &table, 8, page)?;
        assert_eq!(cu_k.to_vec1::<u32>()?, vec![0, 4, 12]);
        let packed = flash_attn_varlen(&q, &flat_k, &flat_v, &seqlens_q, &cu_k, 5, 8, 0.3, true)?;
        let diff = (paged - packed)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff <= 1e-6, "max difference {diff}");
        let bad = Tensor::new(&[[5u32, 0, 0], [2, 9, 1]], dev)?;
        let err = gather_pages(&k, &v, &seqlens_k, &bad, 8, page).unwrap_err();
        assert!(err.to_string().contains("block_table[1][1]"), "{err}");
        Ok(())
    }
}
