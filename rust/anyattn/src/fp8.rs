//! The 8-bit float storage types of a quantized KV cache: raw bits, with exact conversion to
//! `f32` and the library's rounding from it.

/// float8 e4m3 with `torch.float8_e4m3fn`'s convention: bias 7, no infinities, largest finite
/// ±448, NaN `S.1111.111`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

/// float8 e5m2 (`torch.float8_e5m2`): IEEE-style, bias 15, ±inf, NaNs, largest finite ±57344.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct F8E5M2(pub u8);

/// The magnitude of an 8-bit float with `mant` mantissa bits and exponent bias `bias` (finite
/// encodings only).
fn magnitude(bits: u8, mant: u32, bias: i32) -> f32 {
    let exp = i32::from((bits & 0x7F) >> mant);
    let m = (bits & ((1u8 << mant) - 1)) as f32;
    if exp == 0 {
        m * 2f32.powi(1 - bias - mant as i32)
    } else {
        (1.0 + m / (1u32 << mant) as f32) * 2f32.powi(exp - bias)
    }
}

/// The 8-bit float nearest to `x` (ties to even) with `mant` mantissa bits, bias `bias` and
/// largest finite encoding `max_bits`; larger magnitudes and infinities saturate to it, NaN
/// becomes `S.1111111` (a NaN in both formats), keeping the sign.
fn round(x: f32, mant: u32, bias: i32, max_bits: u8) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    if x.is_nan() {
        return sign | 0x7F;
    }
    let a = x.abs();
    let max_finite = magnitude(max_bits, mant, bias);
    if a >= max_finite {
        return sign | max_bits;
    }
    // The spacing of a's binade (subnormals: the smallest binade's), a power of two.
    let e = if a > 0.0 { a.log2().floor() as i32 } else { 1 - bias };
    // log2 may misjudge by one next to a power of two; fix e so that 2^e <= a < 2^(e + 1).
    let e = if a >= 2f32.powi(e + 1) {
        e + 1
    } else if a > 0.0 && a < 2f32.powi(e) {
        e - 1
    } else {
        e
    }
    .max(1 - bias);
    let unit = 2f32.powi(e - mant as i32);
    let rounded = (a / unit).round_ties_even() * unit;
    if rounded >= max_finite {
        return sign | max_bits;
    }
    if rounded == 0.0 {
        return sign;
    }
    let re = rounded.log2().floor() as i32;
    let re = if rounded >= 2f32.powi(re + 1) { re + 1 } else { re };
    if re < 1 - bias {
        return sign | (rounded / 2f32.powi(1 - bias - mant as i32)) as u8;
    }
    let m = (rounded / 2f32.powi(re - mant as i32)) as u32 - (1 << mant);
    sign | (((re + bias) as u8) << mant) | m as u8
}

impl F8E4M3 {
    /// The largest finite value, 448.
    pub const MAX: f32 = 448.0;

    /// The e4m3 value nearest to `x` (ties to even), saturating to ±448 (infinities too), as the
    /// library's in-place append rounds; NaN stays NaN.
    pub fn from_f32(x: f32) -> Self {
        F8E4M3(round(x, 3, 7, 0x7E))
    }

    /// The exact value of these bits.
    pub fn to_f32(self) -> f32 {
        if self.0 & 0x7F == 0x7F {
            return f32::NAN;
        }
        let m = magnitude(self.0, 3, 7);
        if self.0 & 0x80 != 0 {
            -m
        } else {
            m
        }
    }
}

impl F8E5M2 {
    /// The largest finite value, 57344.
    pub const MAX: f32 = 57344.0;

    /// The e5m2 value nearest to `x` (ties to even), saturating to ±57344 (infinities too), as
    /// the library's in-place append rounds; NaN stays NaN.
    pub fn from_f32(x: f32) -> Self {
        F8E5M2(round(x, 2, 15, 0x7B))
    }

    /// The exact value of these bits.
    pub fn to_f32(self) -> f32 {
        let m = if self.0 & 0x7C == 0x7C {
            if self.0 & 0x03 != 0 {
                return f32::NAN;
            }
            f32::INFINITY
        } else {
            magnitude(self.0, 2, 15)
        };
        if self.0 & 0x80 != 0 {
            -m
        } else {
            m
        }
    }
}

/// The int8 nearest to `x` (ties to even), saturating to the symmetric ±127 as the library's
/// append does (infinities too); NaN becomes 0.
pub fn i8_from_f32(x: f32) -> i8 {
    if x.is_nan() {
        0
    } else {
        x.round_ties_even().clamp(-127.0, 127.0) as i8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_pattern_round_trips() {
        for b in 0..=255u8 {
            let x = F8E4M3(b).to_f32();
            if !x.is_nan() {
                assert_eq!(F8E4M3::from_f32(x).0, b, "e4m3 {b:#x} = {x}");
            }
            let y = F8E5M2(b).to_f32();
            if y.is_finite() {
                assert_eq!(F8E5M2::from_f32(y).0, b, "e5m2 {b:#x} = {y}");
            }
        }
    }

    #[test]
    fn rounds_ties_to_even_and_saturates() {
        assert_eq!(F8E4M3::from_f32(1.0625).to_f32(), 1.0);
        assert_eq!(F8E4M3::from_f32(1.1875).to_f32(), 1.25);
        assert_eq!(F8E4M3::from_f32(1e6).0, 0x7E);
        assert_eq!(F8E4M3::from_f32(f32::NEG_INFINITY).0, 0xFE);
        assert_eq!(F8E5M2::from_f32(f32::INFINITY).0, 0x7B);
        assert_eq!(F8E4M3::from_f32(2f32.powi(-10)).0, 0); // half the smallest subnormal
        assert!(F8E5M2::from_f32(f32::NAN).to_f32().is_nan());
        assert_eq!(i8_from_f32(2.5), 2);
        assert_eq!(i8_from_f32(-300.0), -127);
        assert_eq!(i8_from_f32(f32::NAN), 0);
    }
}
