//! The public API is candle-flash-attn 0.11.1's: every public function with its exact signature
//! (each bound to a function pointer of the upstream type, so a difference fails to compile) and
//! `FlashAttn` with its five public fields as a `CustomOp3`. The behaviour is tested by upstream's
//! own test file (the candle-flash-attn-upstream-tests package) and by candle-anyattn's tests.

use candle_core::{Device, Result, Tensor};

type Dense = fn(&Tensor, &Tensor, &Tensor, f32, bool) -> Result<Tensor>;
type DenseWindowed =
    fn(&Tensor, &Tensor, &Tensor, f32, Option<usize>, Option<usize>) -> Result<Tensor>;
type DenseAlibi = fn(&Tensor, &Tensor, &Tensor, &Tensor, f32, bool) -> Result<Tensor>;
type DenseAlibiWindowed =
    fn(&Tensor, &Tensor, &Tensor, &Tensor, f32, Option<usize>, Option<usize>) -> Result<Tensor>;
type DenseSoftcap = fn(
    &Tensor,
    &Tensor,
    &Tensor,
    Option<&Tensor>,
    f32,
    Option<usize>,
    Option<usize>,
    f32,
) -> Result<Tensor>;
type Varlen =
    fn(&Tensor, &Tensor, &Tensor, &Tensor, &Tensor, usize, usize, f32, bool) -> Result<Tensor>;
type VarlenWindowed = fn(
    &Tensor,
    &Tensor,
    &Tensor,
    &Tensor,
    &Tensor,
    usize,
    usize,
    f32,
    Option<usize>,
    Option<usize>,
) -> Result<Tensor>;
type VarlenPaged = fn(
    &Tensor,
    &Tensor,
    &Tensor,
    &Tensor,
    &Tensor,
    &Tensor,
    Option<&Tensor>,
    usize,
    usize,
    f32,
    Option<usize>,
    Option<usize>,
    usize,
    Option<f32>,
) -> Result<Tensor>;
type VarlenAlibi = fn(
    &Tensor,
    &Tensor,
    &Tensor,
    &Tensor,
    &Tensor,
    &Tensor,
    usize,
    usize,
    f32,
    bool,
) -> Result<Tensor>;
type VarlenAlibiWindowed = fn(
    &Tensor,
    &Tensor,
    &Tensor,
    &Tensor,
    &Tensor,
    &Tensor,
    usize,
    usize,
    f32,
    Option<usize>,
    Option<usize>,
) -> Result<Tensor>;
type VarlenSoftcap = fn(
    &Tensor,
    &Tensor,
    &Tensor,
    Option<&Tensor>,
    &Tensor,
    &Tensor,
    usize,
    usize,
    f32,
    Option<usize>,
    Option<usize>,
    f32,
) -> Result<Tensor>;

#[test]
fn functions_have_candle_flash_attn_0_11_1_signatures() -> Result<()> {
    use candle_flash_attn as fa;
    let flash_attn: Dense = fa::flash_attn;
    let _: DenseWindowed = fa::flash_attn_windowed;
    let _: DenseAlibi = fa::flash_attn_alibi;
    let _: DenseAlibiWindowed = fa::flash_attn_alibi_windowed;
    let _: DenseSoftcap = fa::flash_attn_alibi_windowed_softcap;
    let varlen: Varlen = fa::flash_attn_varlen;
    let _: VarlenWindowed = fa::flash_attn_varlen_windowed;
    let _: VarlenPaged = fa::flash_attn_varlen_paged_windowed;
    let _: VarlenAlibi = fa::flash_attn_varlen_alibi;
    let _: VarlenAlibiWindowed = fa::flash_attn_varlen_alibi_windowed;
    let _: VarlenSoftcap = fa::flash_attn_varlen_alibi_windowed_softcap;

    // The functions are candle-anyattn's, bit for bit, on CPU tensors.
    let dev = &Device::Cpu;
    let q = Tensor::randn(0f32, 1., (1, 5, 4, 16), dev)?;
    let k = Tensor::randn(0f32, 1., (1, 7, 2, 16), dev)?;
    let v = Tensor::randn(0f32, 1., (1, 7, 2, 16), dev)?;
    let ours = flash_attn(&q, &k, &v, 0.25, true)?;
    let theirs = candle_anyattn::flash_attn(&q, &k, &v, 0.25, true)?;
    assert_eq!(
        ours.flatten_all()?.to_vec1::<f32>()?,
        theirs.flatten_all()?.to_vec1::<f32>()?
    );

    let cu = Tensor::new(&[0u32, 5], dev)?;
    let cu_k = Tensor::new(&[0u32, 7], dev)?;
    let (q3, k3, v3) = (q.squeeze(0)?, k.squeeze(0)?, v.squeeze(0)?);
    let packed = varlen(&q3, &k3, &v3, &cu, &cu_k, 5, 7, 0.25, true)?;
    assert_eq!(packed.to_vec3::<f32>()?, ours.squeeze(0)?.to_vec3::<f32>()?);
    Ok(())
}

#[test]
fn flash_attn_op_has_the_upstream_fields() -> Result<()> {
    let dev = &Device::Cpu;
    let q = Tensor::randn(0f32, 1., (2, 3, 2, 8), dev)?;
    let op = candle_flash_attn::FlashAttn {
        softmax_scale: 0.5,
        alibi_slopes: None,
        window_size_left: None,
        window_size_right: Some(0),
        softcap: None,
    };
    let out = q.apply_op3(&q, &q, op)?;
    let direct = candle_flash_attn::flash_attn(&q, &q, &q, 0.5, true)?;
    assert_eq!(
        out.flatten_all()?.to_vec1::<f32>()?,
        direct.flatten_all()?.to_vec1::<f32>()?
    );
    Ok(())
}
