//! For tests that read a shader's own constants or run one of its functions, or dispatch shaders
//! of their own.

/// The library's read-back (byte ranges of GPU buffers to the host), for tests that dispatch
/// shaders of their own.
pub use crate::gpu::readback::read_back;

/// The value of a module's `u32` constant `name`, as naga evaluated it when parsing: how tests
/// compare a shader's own derived sizes with the host's. `None` if there is no such constant or
/// it is not a `u32`. Native only (naga is a native dependency).
#[cfg(not(target_arch = "wasm32"))]
pub fn wgsl_u32_constant(module: &naga::Module, name: &str) -> Option<u32> {
    let (_, constant) = module.constants.iter().find(|(_, c)| c.name.as_deref() == Some(name))?;
    match module.global_expressions[constant.init] {
        naga::Expression::Literal(naga::Literal::U32(v)) => Some(v),
        _ => None,
    }
}

/// The text of WGSL source `src` from the first `from` through the closing brace of the first
/// function `fn_name` after it (comments skipped as the unroller skips them): how a test runs one
/// function of a kernel, as written, on a device the whole kernel cannot run on.
pub fn wgsl_through_fn<'a>(src: &'a str, from: &str, fn_name: &str) -> Option<&'a str> {
    let start = src.find(from)?;
    let func = start + src[start..].find(&format!("fn {fn_name}("))?;
    let open = func + src[func..].find('{')?;
    let close = crate::wgsl::unroll::matching_brace(src, open)?;
    Some(&src[start..=close])
}
