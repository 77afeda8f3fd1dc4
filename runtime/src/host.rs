//! Addresses of the host functions artifact code may call ([`HostFn`]).

use crate::format::HostFn;

// The C math library; Rust's std already links it on Linux, the attribute
// makes the dependency explicit (and matters for the staticlib).
#[cfg_attr(target_os = "linux", link(name = "m"))]
extern "C" {
    fn expf(x: f32) -> f32;
    fn logf(x: f32) -> f32;
    fn tanhf(x: f32) -> f32;
    fn powf(x: f32, y: f32) -> f32;
    fn sinf(x: f32) -> f32;
    fn cosf(x: f32) -> f32;
    fn floorf(x: f32) -> f32;
    fn ceilf(x: f32) -> f32;
    fn truncf(x: f32) -> f32;
    fn nearbyintf(x: f32) -> f32;
    fn fmaf(x: f32, y: f32, z: f32) -> f32;
    fn fmodf(x: f32, y: f32) -> f32;
    fn sqrtf(x: f32) -> f32;
    fn exp(x: f64) -> f64;
    fn log(x: f64) -> f64;
    fn tanh(x: f64) -> f64;
    fn pow(x: f64, y: f64) -> f64;
    fn floor(x: f64) -> f64;
    fn ceil(x: f64) -> f64;
    fn trunc(x: f64) -> f64;
    fn nearbyint(x: f64) -> f64;
    fn fma(x: f64, y: f64, z: f64) -> f64;
    fn fmod(x: f64, y: f64) -> f64;
    fn sqrt(x: f64) -> f64;
    fn erff(x: f32) -> f32;
    fn atanf(x: f32) -> f32;
    fn atan2f(y: f32, x: f32) -> f32;
    fn sinhf(x: f32) -> f32;
    fn coshf(x: f32) -> f32;
    fn asinf(x: f32) -> f32;
    fn acosf(x: f32) -> f32;
    fn tanf(x: f32) -> f32;
}

type F1 = unsafe extern "C" fn(f32) -> f32;
type F2 = unsafe extern "C" fn(f32, f32) -> f32;
type F3 = unsafe extern "C" fn(f32, f32, f32) -> f32;
type D1 = unsafe extern "C" fn(f64) -> f64;
type D2 = unsafe extern "C" fn(f64, f64) -> f64;
type D3 = unsafe extern "C" fn(f64, f64, f64) -> f64;
type Nms = unsafe extern "C" fn(
    *const f32,
    *const f32,
    *mut i64,
    *mut u32,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    i64,
    f32,
    f32,
);

type UniqueFn = unsafe extern "C" fn(*const u64, u64, u64, u64, u64, u64, *mut u32, *mut i64);

/// [`HostFn::Unique`]: `kiln_host::Unique::select` over arena regions the
/// artifact's kernel passes.
///
/// # Safety
/// `keys` holds `outer · n · inner` 8-byte keys (f64 when `float_keys` is
/// 1, else i64), `scratch` `2n` u32 and `out` `3n + 1` i64, `scratch` and
/// `out` overlapping nothing else (distinct arena values).
unsafe extern "C" fn unique(
    keys: *const u64,
    float_keys: u64,
    outer: u64,
    n: u64,
    inner: u64,
    sorted: u64,
    scratch: *mut u32,
    out: *mut i64,
) {
    let u = kiln_host::Unique {
        outer: outer as usize,
        n: n as usize,
        inner: inner as usize,
        sorted: sorted != 0,
    };
    let len = u.outer * u.n * u.inner;
    // SAFETY: per the contract, each region holds these many elements,
    // 8-byte aligned (arena values are), and the mutable ones overlap
    // nothing else.
    let (keys, scratch, out) = unsafe {
        let keys = match float_keys {
            1 => kiln_host::Keys::Float(std::slice::from_raw_parts(keys.cast::<f64>(), len)),
            _ => kiln_host::Keys::Int(std::slice::from_raw_parts(keys.cast::<i64>(), len)),
        };
        (
            keys,
            std::slice::from_raw_parts_mut(scratch, u.scratch_len()),
            std::slice::from_raw_parts_mut(out, u.out_len()),
        )
    };
    u.select(keys, scratch, out);
}

/// [`HostFn::NonMaxSuppression`]: `kiln_host::Nms::select` over arena
/// regions the artifact's kernel passes; the last of the `bound + 1` rows
/// of `out` gets the count.
///
/// # Safety
/// The pointers hold the sizes the arguments give: `boxes` `b·n·4` f32,
/// `scores` `b·c·n` f32, `out` `(bound + 1)·3` i64, `scratch`
/// `Nms::scratch_len` u32, none overlapping `out` or `scratch` (the
/// compiler planned them as distinct arena values).
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn non_max_suppression(
    boxes: *const f32,
    scores: *const f32,
    out: *mut i64,
    scratch: *mut u32,
    batches: u64,
    classes: u64,
    count: u64,
    cap: u64,
    center_point_box: u64,
    has_score_threshold: u64,
    max_per_class: i64,
    iou_threshold: f32,
    score_threshold: f32,
) {
    let nms = kiln_host::Nms {
        batches: batches as usize,
        classes: classes as usize,
        boxes: count as usize,
        cap: cap as usize,
        max_per_class,
        center_point_box: center_point_box != 0,
        iou_threshold,
        score_threshold: (has_score_threshold != 0).then_some(score_threshold),
    };
    let (b, c, n) = (nms.batches, nms.classes, nms.boxes);
    // SAFETY: per the contract, each region holds these many elements and
    // `out` and `scratch` overlap nothing else.
    let (boxes, scores, out, scratch) = unsafe {
        (
            std::slice::from_raw_parts(boxes, b * n * 4),
            std::slice::from_raw_parts(scores, b * c * n),
            std::slice::from_raw_parts_mut(out, (nms.bound() + 1) * 3),
            std::slice::from_raw_parts_mut(scratch, nms.scratch_len()),
        )
    };
    let (rows, last) = out.split_at_mut(nms.bound() * 3);
    let selected = nms.select(boxes, scores, scratch, rows);
    last.fill(selected as i64);
}

/// The address of `f` in this process.
pub(crate) fn address(f: HostFn) -> u64 {
    let addr = match f {
        HostFn::Expf => expf as F1 as usize,
        HostFn::Logf => logf as F1 as usize,
        HostFn::Tanhf => tanhf as F1 as usize,
        HostFn::Powf => powf as F2 as usize,
        HostFn::Sinf => sinf as F1 as usize,
        HostFn::Cosf => cosf as F1 as usize,
        HostFn::Floorf => floorf as F1 as usize,
        HostFn::Ceilf => ceilf as F1 as usize,
        HostFn::Truncf => truncf as F1 as usize,
        HostFn::Nearbyintf => nearbyintf as F1 as usize,
        HostFn::Fmaf => fmaf as F3 as usize,
        HostFn::Fmodf => fmodf as F2 as usize,
        HostFn::Sqrtf => sqrtf as F1 as usize,
        HostFn::Exp => exp as D1 as usize,
        HostFn::Log => log as D1 as usize,
        HostFn::Tanh => tanh as D1 as usize,
        HostFn::Pow => pow as D2 as usize,
        HostFn::Floor => floor as D1 as usize,
        HostFn::Ceil => ceil as D1 as usize,
        HostFn::Trunc => trunc as D1 as usize,
        HostFn::Nearbyint => nearbyint as D1 as usize,
        HostFn::Fma => fma as D3 as usize,
        HostFn::Fmod => fmod as D2 as usize,
        HostFn::Sqrt => sqrt as D1 as usize,
        HostFn::Erff => erff as F1 as usize,
        HostFn::Atanf => atanf as F1 as usize,
        HostFn::Atan2f => atan2f as F2 as usize,
        HostFn::Sinhf => sinhf as F1 as usize,
        HostFn::Coshf => coshf as F1 as usize,
        HostFn::Asinf => asinf as F1 as usize,
        HostFn::Acosf => acosf as F1 as usize,
        HostFn::Tanf => tanf as F1 as usize,
        HostFn::NonMaxSuppression => non_max_suppression as Nms as usize,
        HostFn::Unique => unique as UniqueFn as usize,
    };
    addr as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_host_fn_resolves() {
        for f in HostFn::ALL {
            assert_ne!(address(f), 0, "{}", f.name());
        }
        // SAFETY: the address is libm's expf, whose signature is F1.
        let e: F1 = unsafe { std::mem::transmute(address(HostFn::Expf) as usize) };
        // SAFETY: expf reads its argument and nothing else.
        assert_eq!(unsafe { e(0.0) }, 1.0);
    }
}
