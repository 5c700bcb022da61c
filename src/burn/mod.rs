//! burn's attention on our kernels (feature `burn`): [`attention`] takes the arguments of
//! `burn::tensor::module::attention` and runs our wgpu kernels on burn's own wgpu device and
//! queue, reading burn's buffers in place; what they do not run goes to burn's attention.
//!
//! ```no_run
//! use burn_tensor::{ops::AttentionModuleOptions, Distribution, Tensor};
//! # fn main() -> wgpu_flash_attn::Result<()> {
//! // burn's wgpu runtime, with our engine on its device and queue.
//! let device = wgpu_flash_attn::burn::init(burn_tensor::Device::wgpu_options())?;
//! let q = Tensor::<4>::random([2, 32, 1024, 128], Distribution::Default, &device); // [batch, heads, seq, head_dim]
//! let kv = Tensor::<4>::random([2, 8, 1024, 128], Distribution::Default, &device); // GQA 32/8
//! let options = AttentionModuleOptions { is_causal: true, ..Default::default() };
//! let out = wgpu_flash_attn::burn::attention(q, kv.clone(), kv, None, None, options);
//! assert_eq!(out.dims(), [2, 32, 1024, 128]);
//! # Ok(()) }
//! ```
//!
//! (The README's example; with `burn = "=0.23.0-pre.1"`, `burn::tensor` is `burn_tensor`.)
//!
//! * **Versions.** burn `=0.23.0-pre.1` and cubecl `=0.12.0-pre.1`, pinned exactly: the first
//!   releases of burn on wgpu 30, which this crate uses. burn's tensors have no backend type
//!   parameter since 0.23 (`Tensor<4>`; the device picks the backend at run time), and burn
//!   needs rust 1.95.
//! * **The device.** [`init`] brings burn's wgpu runtime up (burn's own device selection and
//!   options) and registers an engine on the `wgpu::Device` and `wgpu::Queue` burn got; a
//!   program that brought the runtime up itself with `init_with_setup` passes the setup to
//!   [`register`]. Tensors on other devices (CUDA, the CPU, a wgpu device nobody registered)
//!   run on burn's attention.
//! * **Tensors.** `[batch, heads, seq, head_dim]` (our `Layout::Bhsd`), `key` and `value` with
//!   `num_kv_heads` dividing `num_heads` (GQA, MQA), `head_dim` a multiple of 8 up to 256 for all
//!   three; f32 and f16 (where burn's device has `shader-f16`), and bf16 where burn's wgpu
//!   runtime has it (not on lavapipe). Views (swapped dims, slices, broadcasts) are read in
//!   place where the last dimension is contiguous and the other strides are multiples of 4
//!   elements, else copied first on the device.
//! * **Options.** `scale`, `softcap` and `is_causal` aligned to the bottom right (burn's
//!   default, FlashAttention's); top-left alignment where `seq_q == seq_kv` (the same mask).
//! * **burn's attention** runs what ours does not: a `mask` or `attn_bias`, top-left causal
//!   alignment with `seq_q ≠ seq_kv`, a value `head_dim` other than the query's, other element
//!   types, head_dims the kernels do not take, tensors under autodiff (our backward is not wired
//!   to burn's autodiff yet), and anything `FlashAttention::select` refuses on the device.
//!   [`flash_attention`] is the same call without that fallback: the reason as an [`Error`].
//! * **Zero copy.** The call is an operation of burn's fusion stream, executed in its order on
//!   the cube tensors behind the fused ones: their wgpu buffers (`get_resource`, which pins them
//!   and submits what burn queued before) are bound at their offsets and strides, the output is
//!   a tensor burn allocates, and our kernel goes to burn's queue. Where burn's allocator put the
//!   output in the same `wgpu::Buffer` as an input (wgpu forbids binding one buffer read-only
//!   and writable in a dispatch), the kernel writes a buffer of ours and a copy on the device
//!   moves it ([`Calls::staged`]): burn's default memory slices small tensors from shared pages;
//!   `MemoryConfiguration::ExclusivePages` in the options given to [`init`] gives every tensor a
//!   buffer of its own, and nothing is staged. No host copies either way.

mod op;
mod problem;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use burn_cubecl::Cube;
use burn_fusion::custom::{CustomOpIr, OperationIr, StreamId, TensorIr};
use burn_tensor::ops::AttentionModuleOptions;
use burn_tensor::wgpu::{WgpuOptions, WgpuSetup};
use burn_tensor::{Bool, Device, Tensor};

use crate::device::context::GpuContext;
use crate::error::{Error, Result};
use crate::runtime::forward::{FlashAttention, Options};
use op::{FlashOp, Registered};
use problem::unavailable;

/// The engines registered for burn devices.
static ENGINES: Mutex<Vec<Arc<Registered>>> = Mutex::new(Vec::new());

/// The engine registered for `device`, if any (autodiff or not: tensors under autodiff are
/// refused later, when their primitive is asked for).
fn registered(device: &Device) -> Option<Arc<Registered>> {
    let engines = ENGINES.lock().unwrap_or_else(|e| e.into_inner());
    engines.iter().find(|r| r.device == *device).cloned()
}

/// Brings burn's wgpu runtime up with `options` (`burn_tensor::Device::wgpu_options()` and its
/// setters: adapter kind, graphics API, memory) and registers an engine with default
/// [`Options`] on the device and queue burn got: [`attention`] on the returned device's tensors
/// runs our kernels. burn's error (a runtime already brought up for that selection, no adapter)
/// is [`Error::RequestDevice`].
pub fn init(options: WgpuOptions) -> Result<Device> {
    let (device, setup) = options
        .init_with_setup()
        .map_err(|e| Error::RequestDevice(format!("burn's wgpu runtime: {e}")))?;
    register(&device, &setup, Options::default())?;
    Ok(device)
}

/// Registers an engine with `options` for the burn wgpu `device` whose runtime runs on `setup`
/// (what `WgpuOptions::init_with_setup` returns, or the setup the program registered with
/// `WgpuOptions::setup`): the engine uses its `wgpu::Device` and `wgpu::Queue`, with the
/// features and limits burn requested, cooperative matrices where the device has them. A device
/// registered again gets the new engine. [`Error::Unavailable`] if `device` is not a wgpu device.
pub fn register(device: &Device, setup: &WgpuSetup, options: Options) -> Result<()> {
    use burn_cubecl::CubeDevice;
    use burn_dispatch::DispatchDevice;
    if !matches!(device.as_dispatch(), DispatchDevice::Cube(CubeDevice::Wgpu(_))) {
        return Err(unavailable(
            format!("wgpu-flash-attn on burn's {device:?}"),
            "it is not a wgpu device",
        ));
    }
    let mut ctx = GpuContext::from_device(setup.device.clone(), setup.queue.clone(), setup.adapter.get_info());
    ctx.caps = ctx
        .caps
        .with_cooperative_matrix(&ctx.device, &setup.adapter.cooperative_matrix_properties());
    pollster::block_on(ctx.probe_register_layout());
    let engine = Arc::new(Registered::new(
        device.clone(),
        FlashAttention::with_options(&ctx, options),
    ));
    let mut engines = ENGINES.lock().unwrap_or_else(|e| e.into_inner());
    engines.retain(|r| r.device != *device);
    engines.push(engine);
    Ok(())
}

/// What ran for a registered device's tensors (see [`calls`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Calls {
    /// Calls our kernels ran. Counted when burn executes the call, which is when something
    /// reads or syncs its output.
    pub flash: u64,
    /// Calls burn's attention ran: what the kernels do not take, refused at the call (counted
    /// then), or at execution (strides or buffers the kernels could not use; counted then).
    pub burn: u64,
    /// Of `flash`, calls whose output burn had placed in an input's `wgpu::Buffer`: the kernel
    /// wrote a buffer of ours and a copy on the device moved the result.
    pub staged: u64,
}

/// What ran for `device`'s tensors since it was registered; all zero for a device with no
/// engine.
pub fn calls(device: &Device) -> Calls {
    registered(device)
        .map(|r| Calls {
            flash: r.flash.load(Ordering::Relaxed),
            burn: r.burn.load(Ordering::Relaxed),
            staged: r.staged.load(Ordering::Relaxed),
        })
        .unwrap_or_default()
}

/// `softmax(scale·QKᵀ [softcap, causal mask])·V` with `burn::tensor::module::attention`'s
/// arguments and result: `query` `[batch, num_heads, seq_q, head_dim]`, `key` and `value`
/// `[batch, num_kv_heads, seq_kv, head_dim]`, the output `[batch, num_heads, seq_q, head_dim]`.
/// On a registered device's tensors our kernels run it where they can, burn's attention
/// otherwise (the [module](self) lists when); on other devices burn's attention runs it, and so
/// does every burn check and panic on bad arguments.
pub fn attention(
    query: Tensor<4>,
    key: Tensor<4>,
    value: Tensor<4>,
    mask: Option<Tensor<4, Bool>>,
    attn_bias: Option<Tensor<4>>,
    options: AttentionModuleOptions,
) -> Tensor<4> {
    if let Some(reg) = registered(&query.device()) {
        if mask.is_none() && attn_bias.is_none() {
            if let Ok(out) = flash(&reg, &query, &key, &value, &options) {
                return out;
            }
        }
        reg.burn.fetch_add(1, Ordering::Relaxed);
    }
    burn_tensor::module::attention(query, key, value, mask, attn_bias, options)
}

/// [`attention`] without a mask or bias and without burn's fallback: our kernels' output, or
/// the reason they do not run the call (no engine registered for the tensors' device, an
/// option, shape or element type they do not take, tensors under autodiff). A call accepted
/// here still runs on burn's attention if, when burn executes it, the tensors' strides or
/// buffers turn out unusable ([`Calls::burn`]).
pub fn flash_attention(
    query: &Tensor<4>,
    key: &Tensor<4>,
    value: &Tensor<4>,
    options: AttentionModuleOptions,
) -> Result<Tensor<4>> {
    let device = query.device();
    let reg = registered(&device).ok_or_else(|| {
        unavailable(
            format!("wgpu-flash-attn on burn's {device:?}"),
            "no engine is registered for it (wgpu_flash_attn::burn::init or register)",
        )
    })?;
    flash(&reg, query, key, value, &options)
}

/// Records our attention on the tensors' fusion stream, after checking what can be checked from
/// their shapes, element types and the options.
fn flash(
    reg: &Arc<Registered>,
    query: &Tensor<4>,
    key: &Tensor<4>,
    value: &Tensor<4>,
    options: &AttentionModuleOptions,
) -> Result<Tensor<4>> {
    for (name, t) in [("key", key), ("value", value)] {
        if t.device() != reg.device {
            return Err(Error::InvalidProblem(format!(
                "query is on {:?} and {name} on {:?}",
                reg.device,
                t.device()
            )));
        }
    }
    let dims = |t: &Tensor<4>| t.shape().dims::<4>();
    let problem = problem::problem(
        [dims(query), dims(key), dims(value)],
        [query.dtype(), key.dtype(), value.dtype()],
        options,
    )?;
    reg.engine.select(&problem)?;
    let primitive = |name: &str, t: &Tensor<4>| {
        t.clone()
            .try_into_primitive::<Cube>()
            .map_err(|e| unavailable(format!("wgpu-flash-attn on this {name} tensor"), format!("{e:?}")))
    };
    let (q, k, v) = (
        primitive("query", query)?,
        primitive("key", key)?,
        primitive("value", value)?,
    );
    let client = q.client.clone();
    let out = TensorIr::uninit(client.create_empty_handle(), query.shape(), query.dtype());
    let desc = CustomOpIr::new("wgpu-flash-attn", &[q.into_ir(), k.into_ir(), v.into_ir()], &[out]);
    let op = FlashOp {
        desc: desc.clone(),
        registered: reg.clone(),
        problem,
        options: *options,
    };
    let mut outputs = client.register(StreamId::current(), OperationIr::Custom(desc), op);
    Ok(Tensor::<4>::from_primitive::<Cube>(outputs.remove(0)))
}

/// Test support: fill every output with NaN before the kernel writes it, so that a kernel that
/// writes nothing fails a comparison instead of passing on memory a previous tensor left.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub fn poison_outputs(on: bool) {
    op::POISON_OUTPUTS.store(on, Ordering::Relaxed);
}
