//! The CUDA attention engine: loads kernels (memory cache in front of the NVRTC/disk cache),
//! checks buffers, launches on the device's stream, and offers a host-slice convenience.

use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::backward::{BackwardScratch, LoadedBackward};
use super::device::CudaDevice;
use super::disk_cache::{CacheStatus, DiskCache, Origin};
use super::fp8::{LoadedFp8, LoadedQuantizer};
use super::grad_sum::LoadedGradSum;
use super::kernel_map::OnceMap;
use super::merge::LoadedMerge;
use super::nvrtc::{load_or_compile, resource_report, CompileJob};
use super::plan::tensor_map::{bias_map_spec, tensor_map_spec};
use super::plan::{
    decode_counters_len, decode_split, default_decode_plan, goes_to_decode, persistent_grid, select_cuda,
    validate_for_cuda, validate_for_decode, vec_bytes_for, wgmma_unavailable, CudaBackwardConfig, CudaDecodeConfig,
    CudaKernelConfig, CudaPlan, CudaSelection, DecodeParams, Fp8Config, FwdParams, LaunchGeometry, WgmmaPlan,
};
use super::tma;
use crate::error::{check_holds, invalid, Error, Result};
use crate::plan::decode::DecodeSplit;
use crate::problem::index::BatchIndex;
use crate::problem::score_bias::BiasValues;
use crate::problem::{AttentionProblem, DType, Element, Tensor};
use crate::runtime::forward::AttentionOutput;

// SAFETY: plain `#[repr(C)]` data whose layout `cuda/flash_fwd_mma.cu` mirrors (size asserted on
// both sides); passed by value as the kernel's only parameter.
unsafe impl DeviceRepr for FwdParams {}

// SAFETY: plain `#[repr(C)]` data whose layout `cuda/flash_decode.cu` mirrors (size asserted on
// both sides); passed by value as both decode entry points' only parameter.
unsafe impl DeviceRepr for DecodeParams {}

/// The wgmma kernel's second parameter: the tensor maps of Q, K and V (`struct TmaMaps` in
/// `cuda/flash_fwd_wgmma.cu`, 3 x 128 bytes), passed by value as a `__grid_constant__`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct TmaMaps {
    pub(super) q: cudarc::driver::sys::CUtensorMap,
    pub(super) k: cudarc::driver::sys::CUtensorMap,
    pub(super) v: cudarc::driver::sys::CUtensorMap,
}

const _: () = assert!(std::mem::size_of::<TmaMaps>() == 384);

// SAFETY: three opaque 128-byte tensor maps, the layout the kernel's parameter declares.
unsafe impl DeviceRepr for TmaMaps {}

/// A wgmma kernel's staged score bias: its tensor map (`bias_map` in `cuda/flash_fwd_wgmma.cu`,
/// compiled with `FA_BIAS_TMA`), passed by value after [`TmaMaps`].
#[repr(C)]
#[derive(Clone, Copy)]
struct BiasMap(cudarc::driver::sys::CUtensorMap);

// SAFETY: one opaque 128-byte tensor map, the kernel's `TensorMap` parameter.
unsafe impl DeviceRepr for BiasMap {}

/// A persistent wgmma kernel's last parameter: the work tiles a plain launch's grid would hold
/// (`struct WorkGrid` in `cuda/flash_fwd_wgmma.cu`), while its own grid is one block per SM.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WorkGrid {
    /// A dynamic plan's tile counter (one `int`, 0 between launches); 0 for a static plan.
    next_tile: u64,
    q_tiles: i32,
    heads: i32,
    batch: i32,
}

const _: () = assert!(std::mem::size_of::<WorkGrid>() == 24);

// SAFETY: a device address and three `int`s, the layout the kernel's parameter declares.
unsafe impl DeviceRepr for WorkGrid {}

impl CudaAttention {
    /// The grid to launch for the work tiles `tiles` (a plain launch's grid) of a kernel on
    /// `plan` (`None`: not a wgmma kernel) and, for a persistent plan, the parameter that tells
    /// the kernel what it covers: a plain plan launches `tiles`, a persistent one a block per SM
    /// (or [`CudaOptions::persistent_blocks`]); a dynamic one also gets the engine's tile counter.
    pub(super) fn launch_grid(
        &self,
        tiles: (u32, u32, u32),
        plan: Option<WgmmaPlan>,
    ) -> Result<((u32, u32, u32), Option<WorkGrid>)> {
        let Some(plan) = plan.filter(|p| p.persistent) else {
            return Ok((tiles, None));
        };
        let blocks = match self.options.persistent_blocks {
            Some(0) => return invalid!("CudaOptions::persistent_blocks must be at least 1"),
            Some(n) => n,
            None => self.device.sm_count(),
        };
        let grid = persistent_grid(tiles, blocks)?;
        // persistent_grid keeps the product below 2³⁰, so each factor fits an i32.
        let next_tile = if plan.dynamic { self.tile_counter()? } else { 0 };
        let work = WorkGrid {
            next_tile,
            q_tiles: tiles.0 as i32,
            heads: tiles.1 as i32,
            batch: tiles.2 as i32,
        };
        Ok((grid, Some(work)))
    }

    /// The device address of the dynamic plans' tile counter, allocated zeroed at first use. The
    /// kernel leaves it at 0 when it ends (the block that draws the last number resets it), and
    /// launches on the engine's one stream never overlap, so one counter serves every launch.
    fn tile_counter(&self) -> Result<u64> {
        let mut counter = self.tile_counter.lock().unwrap_or_else(|e| e.into_inner());
        let stream = self.device.stream();
        if counter.is_none() {
            *counter = Some(stream.alloc_zeros::<i32>(1)?);
        }
        let (address, _guard) = counter.as_ref().expect("allocated above").device_ptr(stream);
        Ok(address)
    }
}

/// Settings of a [`CudaAttention`] engine.
#[derive(Clone, Debug, Default)]
pub struct CudaOptions {
    /// Where compiled kernels persist between processes.
    pub disk_cache: DiskCache,
    /// Force a plan instead of the default for each problem (benchmark sweeps); a plan whose
    /// kernel cannot run a problem is an error, never a silent fallback. A prefill plan keeps
    /// decode problems off the decode kernel; a decode plan sends every problem to it.
    pub plan: Option<CudaPlan>,
    /// Force the decode kernel's split of the keys into this many pieces (capped at one per 16
    /// keys; 0 is an error) instead of the wave-efficiency rule over the GPU's SMs (tests, sweeps).
    pub decode_splits: Option<u32>,
    /// Launch a persistent plan on this many blocks (0 is an error) instead of one per SM, so that
    /// each block runs more work tiles (tests, sweeps).
    pub persistent_blocks: Option<u32>,
}

/// What was loaded for one kernel config.
#[derive(Clone, Debug)]
pub struct KernelInfo {
    /// The config this kernel was compiled for.
    pub config: CudaKernelConfig,
    /// Registers per thread (`CU_FUNC_ATTRIBUTE_NUM_REGS`).
    pub num_regs: i32,
    /// Local memory per thread: non-zero means spills or a stack array, both slow.
    pub local_bytes: i32,
    /// CTAs of this kernel one SM runs at once at its block size and shared memory
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`); the decode split rule counts slots with
    /// it. 0 when the driver did not say.
    pub blocks_per_sm: u32,
    /// Whether NVRTC compiled the binary in this process (and how long it took) or it was read
    /// from the disk cache.
    pub origin: Origin,
    /// ptxas's line from the compile log (empty when the cubin came from the disk cache).
    pub resource_report: String,
    /// What the disk cache did: the file read or written, or why it was not used.
    pub disk_cache: CacheStatus,
}

struct LoadedKernel {
    function: CudaFunction,
    /// The decode kernel's combine entry point (same module); `None` for the prefill kernels.
    combine: Option<CudaFunction>,
    /// The decode module's K/V append entry point; `None` for the prefill kernels.
    append: Option<CudaFunction>,
    info: KernelInfo,
}

/// The tensors of one K/V append in device memory
/// ([`append_kv_device`](CudaAttention::append_kv_device)), 16-bit elements of the problem's
/// dtype. The caches are written; nothing written may overlap anything read.
pub struct AppendTensors<'a, T> {
    /// The new tokens' keys, `[batch, seq_q, num_kv_heads, head_dim]` contiguous (`seq_q` of the
    /// problem: the new tokens of each sequence).
    pub new_k: &'a dyn DevicePtr<T>,
    /// Their values, laid out as `new_k`.
    pub new_v: &'a dyn DevicePtr<T>,
    /// The K cache at the problem's K layout (the pool of pages, when paged).
    pub k_cache: &'a mut dyn DevicePtrMut<T>,
    /// The V cache at the problem's V layout.
    pub v_cache: &'a mut dyn DevicePtrMut<T>,
}

/// The tensors of one forward call in device memory, on any stream of the engine's context.
///
/// `q`, `k`, `v` and `o` hold 16-bit elements of the problem's dtype (`u16`, or `half::f16` /
/// `half::bf16` with cudarc's `f16` feature) laid out as the problem's layouts say; `lse` gets
/// `[batch, num_heads, seq_q]` f32. The extents `o` and `lse` write must not overlap each other or
/// the inputs' extents (an `Error::InvalidBuffer` naming both); the inputs may share memory.
pub struct DeviceTensors<'a, T> {
    /// Queries, `problem.required_len(Tensor::Q)` elements or more.
    pub q: &'a dyn DevicePtr<T>,
    /// Keys.
    pub k: &'a dyn DevicePtr<T>,
    /// Values.
    pub v: &'a dyn DevicePtr<T>,
    /// The output, written where the O layout says.
    pub o: &'a mut dyn DevicePtrMut<T>,
    /// Each row's log-sum-exp (natural log), or `None` to skip writing it.
    pub lse: Option<&'a mut dyn DevicePtrMut<f32>>,
}

/// The index tensors of a K/V cache in device memory, for
/// [`forward_indexed_device`](CudaAttention::forward_indexed_device): the page table
/// (`[batch, pages_per_seq]` u32, when the problem's cache is paged) and the per-sequence key
/// counts (`[batch]` u32, when it has lengths); each present exactly when the problem asks for it.
///
/// Their values are not checked on the host (they live on the device): a page number past the
/// pool, or a count above `seq_kv`, is never read through; the rows it affects come out NaN (O
/// and LSE) instead (`cuda/flash_decode.cu`). The host path
/// [`forward_indexed`](CudaAttention::forward_indexed) checks them with [`BatchIndex::validate`].
#[derive(Default)]
pub struct DeviceBatchIndex<'a> {
    /// A packed batch's `[batch + 1]` query-row offsets ([`AttentionProblem::with_varlen`]).
    pub cu_seqlens_q: Option<&'a dyn DevicePtr<u32>>,
    /// A packed batch's `[batch + 1]` key-row offsets.
    pub cu_seqlens_k: Option<&'a dyn DevicePtr<u32>>,
    /// The page table, `batch · pages_per_seq` entries or more.
    pub page_table: Option<&'a dyn DevicePtr<u32>>,
    /// Each sequence's key count, `batch` entries or more.
    pub kv_lens: Option<&'a dyn DevicePtr<u32>>,
    /// `[num_heads]` ALiBi slopes, for a problem with per-head slopes
    /// ([`AttentionProblem::with_alibi_slopes`](crate::problem::AttentionProblem::with_alibi_slopes)).
    pub alibi_slopes: Option<&'a dyn DevicePtr<f32>>,
    /// `[num_heads]` sink logits ([`AttentionProblem::with_sinks`]).
    pub sinks: Option<&'a dyn DevicePtr<f32>>,
    /// The score bias ([`AttentionProblem::with_bias`]) in its element type, holding its
    /// layout's extent. Its values are read as they are (a NaN in it makes NaN rows).
    pub bias: Option<DeviceBias<'a>>,
}

/// A score bias in device memory, in the element type the problem's [`ScoreBias`] names (16-bit
/// types as their bits).
///
/// [`ScoreBias`]: crate::problem::score_bias::ScoreBias
#[derive(Clone, Copy)]
pub enum DeviceBias<'a> {
    /// f32 values.
    F32(&'a dyn DevicePtr<f32>),
    /// f16 values as their bits.
    F16(&'a dyn DevicePtr<u16>),
    /// bf16 values as their bits.
    BF16(&'a dyn DevicePtr<u16>),
}

impl DeviceBias<'_> {
    fn dtype(&self) -> DType {
        match self {
            DeviceBias::F32(_) => DType::F32,
            DeviceBias::F16(_) => DType::F16,
            DeviceBias::BF16(_) => DType::BF16,
        }
    }

    fn len(&self) -> usize {
        match self {
            DeviceBias::F32(t) => t.len(),
            DeviceBias::F16(t) | DeviceBias::BF16(t) => t.len(),
        }
    }

    /// Its device address and the guard that orders the launch after earlier writes to it.
    fn pointer<'s>(
        &'s self,
        stream: &'s std::sync::Arc<cudarc::driver::CudaStream>,
    ) -> (u64, cudarc::driver::SyncOnDrop<'s>) {
        match self {
            DeviceBias::F32(t) => t.device_ptr(stream),
            DeviceBias::F16(t) | DeviceBias::BF16(t) => t.device_ptr(stream),
        }
    }
}

/// Runs exact attention on one CUDA device. Kernels compile on first use (or load from the disk
/// cache) and stay loaded: keep one engine per device.
pub struct CudaAttention {
    device: CudaDevice,
    options: CudaOptions,
    kernels: OnceMap<CudaKernelConfig, LoadedKernel>,
    /// The decode kernel's partial outputs and LSEs, and the fused combine's counters.
    decode_scratch: Mutex<DecodeScratch>,
    /// The backward's modules, one per config (src/cuda/backward.rs).
    pub(super) backward_kernels: OnceMap<CudaBackwardConfig, LoadedBackward>,
    /// The backward's workspace, reused between calls.
    pub(super) backward_scratch: Mutex<BackwardScratch>,
    /// The FP8 forward's kernels, one per config, and the quantizer (src/cuda/fp8.rs).
    pub(super) fp8_kernels: OnceMap<Fp8Config, LoadedFp8>,
    pub(super) fp8_quantizer: OnceMap<(), LoadedQuantizer>,
    /// The merge's module (src/cuda/merge.rs).
    pub(super) merge_kernels: OnceMap<(), LoadedMerge>,
    /// Ring attention's gradient sums' module (src/cuda/grad_sum.rs).
    pub(super) grad_sum_kernels: OnceMap<(), LoadedGradSum>,
    /// The dynamic persistent plans' tile counter ([`Self::launch_grid`]).
    tile_counter: Mutex<Option<CudaSlice<i32>>>,
}

/// Buffers the decode launches reuse, grown to the largest launched. Launches use them in stream
/// order on the engine's one stream, so one of each serves all.
#[derive(Default)]
struct DecodeScratch {
    /// Partial outputs and LSEs (f32), written before they are read in every launch.
    partial: Option<CudaSlice<f32>>,
    /// The fused plans' counters, one per (sequence, K/V head, row block): zeroed when allocated,
    /// and every launch leaves them at 0 (the last CTA of each row block resets its own).
    counters: Option<CudaSlice<u32>>,
}

impl CudaAttention {
    /// An engine with the default options (default disk cache, default plans).
    pub fn new(device: CudaDevice) -> Self {
        Self::with_options(device, CudaOptions::default())
    }

    /// An engine with `options`.
    pub fn with_options(device: CudaDevice, options: CudaOptions) -> Self {
        CudaAttention {
            device,
            options,
            kernels: OnceMap::default(),
            decode_scratch: Mutex::new(DecodeScratch::default()),
            backward_kernels: OnceMap::default(),
            backward_scratch: Mutex::new(BackwardScratch::default()),
            fp8_kernels: OnceMap::default(),
            fp8_quantizer: OnceMap::default(),
            merge_kernels: OnceMap::default(),
            grad_sum_kernels: OnceMap::default(),
            tile_counter: Mutex::new(None),
        }
    }

    /// The device the engine launches on.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// The engine's settings.
    pub fn options(&self) -> &CudaOptions {
        &self.options
    }

    /// The config a launch of `problem` uses when its tensors allow `vec_bytes`-wide access.
    pub fn config_for(&self, problem: &AttentionProblem, vec_bytes: u32) -> Result<CudaKernelConfig> {
        match self.options.plan {
            Some(plan) => {
                validate_for(problem, Some(plan))?;
                CudaKernelConfig::for_problem(problem, plan, vec_bytes)
            }
            None => Ok(self.selection(problem, vec_bytes)?.config),
        }
    }

    /// The default kernel on this device for `problem`, and why not the Hopper kernel when the
    /// choice is the `mma.sync` one.
    pub fn selection(&self, problem: &AttentionProblem, vec_bytes: u32) -> Result<CudaSelection> {
        select_cuda(problem, vec_bytes, self.device.is_hopper())
    }

    /// Compiles (or loads) the kernel of `config` now, so that the first launch is not slow.
    pub fn prepare(&self, config: &CudaKernelConfig) -> Result<KernelInfo> {
        Ok(self.kernel(config)?.info.clone())
    }

    fn kernel(&self, config: &CudaKernelConfig) -> Result<Arc<LoadedKernel>> {
        self.kernels.get_or_try_init(config, || self.load_kernel(config))
    }

    /// Compiles (or reads from the disk cache) and loads the kernel of `config`.
    fn load_kernel(&self, config: &CudaKernelConfig) -> Result<LoadedKernel> {
        if config.is_wgmma() && !self.device.is_hopper() {
            return Err(Error::Unavailable {
                what: format!("kernel {}", config.name()),
                why: format!(
                    "wgmma and TMA need a Hopper GPU (sm_90a); {} is not one",
                    self.device.name()
                ),
            });
        }
        let smem = config.smem_bytes();
        if smem > self.device.max_smem_per_block() {
            return Err(Error::Unavailable {
                what: format!("kernel {}", config.name()),
                why: format!(
                    "it needs {smem} bytes of shared memory per block; {} offers {}",
                    self.device.name(),
                    self.device.max_smem_per_block()
                ),
            });
        }
        let job = CompileJob::forward(config, self.device.arch());
        let cache_dir = self.options.disk_cache.dir();
        let ctx = self.device.context();
        // Loading includes finding the entry point, so that a cached cubin without it is a
        // cache miss (recompiled, replaced) rather than an error in every later process.
        let extra_names = match config {
            CudaKernelConfig::Decode(c) => Some((c.combine_name(), c.append_name())),
            _ => None,
        };
        let fetched = load_or_compile(&job, cache_dir.as_deref(), self.device.driver_version(), |cubin| {
            let module = ctx.load_module(Ptx::from_binary(cubin.to_vec()))?;
            let (combine, append) = match &extra_names {
                Some((combine, append)) => (
                    Some(module.load_function(combine)?),
                    Some(module.load_function(append)?),
                ),
                None => (None, None),
            };
            Ok((module.load_function(&config.name())?, combine, append))
        })?;
        let (function, combine, append) = fetched.value;
        // Above 48 KiB a block must opt in to its dynamic shared memory.
        function.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )?;
        // Ask for the largest shared-memory carve-out: these kernels keep their working set in
        // shared memory and registers, and two blocks of up to 96 KiB must fit an SM.
        function.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
            100,
        )?;
        // Occupancy at the launch's block size and shared memory; 0 (estimate instead) when the
        // driver does not answer.
        let blocks_per_sm = match config {
            CudaKernelConfig::Decode(c) => function
                .occupancy_max_active_blocks_per_multiprocessor(c.plan.threads(), smem as usize, None)
                .unwrap_or(0),
            _ => 0,
        };
        let info = KernelInfo {
            config: *config,
            num_regs: function.num_regs()?,
            local_bytes: function.local_size_bytes()?,
            blocks_per_sm,
            origin: fetched.origin,
            resource_report: resource_report(&fetched.log),
            disk_cache: fetched.cache,
        };
        Ok(LoadedKernel {
            function,
            combine,
            append,
            info,
        })
    }

    /// Enqueues `O = softmax(scale·QKᵀ [causal])·V` and the LSE on the device's stream, on your
    /// buffers (no copies, no synchronization). Returns the kernel config that ran.
    pub fn forward_device<T>(
        &self,
        problem: &AttentionProblem,
        tensors: DeviceTensors<'_, T>,
    ) -> Result<CudaKernelConfig> {
        self.launch(problem, tensors, None, None)
    }

    /// [`forward_device`](Self::forward_device) for a problem with index tensors: a packed batch
    /// ([`AttentionProblem::with_varlen`]: the row offsets; the prefill kernels run it, and check
    /// every offset as they read it), or a K/V cache that is paged or has per-sequence key counts
    /// ([`AttentionProblem::with_paged_kv`], [`AttentionProblem::with_kv_lengths`]: K and V the
    /// page pools, `index` the page table and counts; the decode kernel runs it, any number of
    /// new tokens).
    pub fn forward_indexed_device<T>(
        &self,
        problem: &AttentionProblem,
        tensors: DeviceTensors<'_, T>,
        index: DeviceBatchIndex<'_>,
    ) -> Result<CudaKernelConfig> {
        self.launch(problem, tensors, None, Some(index))
    }

    /// [`forward_device`](Self::forward_device) with an explicit plan.
    pub fn forward_device_with_plan<T>(
        &self,
        problem: &AttentionProblem,
        plan: CudaPlan,
        tensors: DeviceTensors<'_, T>,
    ) -> Result<CudaKernelConfig> {
        self.launch(problem, tensors, Some(plan), None)
    }

    fn launch<T>(
        &self,
        problem: &AttentionProblem,
        t: DeviceTensors<'_, T>,
        plan: Option<CudaPlan>,
        index: Option<DeviceBatchIndex<'_>>,
    ) -> Result<CudaKernelConfig> {
        validate_for(problem, plan.or(self.options.plan))?;
        let index = check_device_index(problem, index, "forward_indexed_device")?;
        check_device_tensors(problem, &t)?;

        let stream = self.device.stream();
        // Each guard makes the stream wait for earlier writes to its buffer and records this
        // launch's use when dropped, after the launch (cudarc's multi-stream bookkeeping).
        let (q, _gq) = t.q.device_ptr(stream);
        let (k, _gk) = t.k.device_ptr(stream);
        let (v, _gv) = t.v.device_ptr(stream);
        let (o, _go) = t.o.device_ptr_mut(stream);
        let (lse, _glse) = output_pointer(t.lse, stream);

        // The index (each tensor or none) and the extents it is read at.
        let (page_table, _gpt) = index_pointer(index.page_table, stream);
        let (kv_lens, _glens) = index_pointer(index.kv_lens, stream);
        let (cu_seqlens_q, _gcq) = index_pointer(index.cu_seqlens_q, stream);
        let (cu_seqlens_k, _gck) = index_pointer(index.cu_seqlens_k, stream);
        let (alibi_slopes, _gslopes) = index_pointer(index.alibi_slopes, stream);
        let (sinks, _gsinks) = index_pointer(index.sinks, stream);
        let (bias, _gbias) = match &index.bias {
            Some(b) => {
                let (p, g) = b.pointer(stream);
                (p, Some(g))
            }
            None => (0, None),
        };
        let mut read = input_extents(problem, [q, k, v]).to_vec();
        if page_table != 0 {
            let len = problem.kv_cache.page_table_len(problem.shape.batch) as u64;
            read.push(("page_table", (page_table, page_table + 4 * len)));
        }
        if kv_lens != 0 {
            read.push(("kv_lens", (kv_lens, kv_lens + 4 * problem.shape.batch as u64)));
        }
        let offsets_bytes = 4 * (problem.shape.batch as u64 + 1);
        if cu_seqlens_q != 0 {
            read.push(("cu_seqlens_q", (cu_seqlens_q, cu_seqlens_q + offsets_bytes)));
            read.push(("cu_seqlens_k", (cu_seqlens_k, cu_seqlens_k + offsets_bytes)));
        }
        let head_bytes = 4 * problem.shape.num_heads as u64;
        if alibi_slopes != 0 {
            read.push(("alibi_slopes", (alibi_slopes, alibi_slopes + head_bytes)));
        }
        if sinks != 0 {
            read.push(("sinks", (sinks, sinks + head_bytes)));
        }
        // The bias's first element: its layout's offset past the buffer's start.
        let mut bias_first = 0;
        if let Some(b) = problem.bias {
            let es = b.dtype.size_bytes() as u64;
            bias_first = bias + b.layout.offset as u64 * es;
            // check_device_index saw that the buffer holds the extent.
            let len = b.required_len(problem).unwrap_or(0) as u64;
            read.push(("bias", (bias, bias + len * es)));
        }
        check_outputs_apart(problem, o, lse, &read)?;

        let vec_bytes = vec_bytes_for(problem, [q, k, v, o])?;
        let config = match plan {
            Some(plan) => CudaKernelConfig::for_problem(problem, plan, vec_bytes)?,
            None => self.config_for(problem, vec_bytes)?,
        };
        // The copy engine reads from 16-byte aligned addresses only: a bias that starts elsewhere
        // is read by the consumers themselves.
        let config = if config.stages_bias() && !bias_first.is_multiple_of(16) {
            config.without_staged_bias()
        } else {
            config
        };
        // The kernel holds the code of exactly its config's score terms: never launch one that
        // would drop a term of the problem or read one it does not set.
        config.check_terms(problem)?;
        if let CudaKernelConfig::Decode(c) = &config {
            self.launch_decode(problem, c, [q, k, v, o], lse, [page_table, kv_lens], alibi_slopes)?;
            return Ok(config);
        }
        let mut geometry = config.geometry(problem)?;
        let (grid, work) = self.launch_grid(geometry.grid, config.plan().wgmma())?;
        geometry.grid = grid;
        let kernel = self.kernel(&config)?;
        let params = FwdParams {
            cu_seqlens_q,
            cu_seqlens_k,
            alibi_slopes,
            sinks,
            bias: bias_first,
            ..FwdParams::new(problem, [q, k, v, o], lse)
        };
        let cfg = LaunchConfig {
            grid_dim: geometry.grid,
            block_dim: geometry.block,
            shared_mem_bytes: geometry.smem_bytes,
        };
        let maps = if config.is_wgmma() {
            if let Some(why) = wgmma_unavailable(problem, vec_bytes, self.device.is_hopper()) {
                return Err(Error::Unavailable {
                    what: format!("kernel {}", config.name()),
                    why,
                });
            }
            let map = |tensor: Tensor, rows: u32, base: u64| -> Result<cudarc::driver::sys::CUtensorMap> {
                tma::encode(&tensor_map_spec(problem, tensor, rows)?, base)
            };
            Some(TmaMaps {
                q: map(Tensor::Q, config.block_m(), q)?,
                k: map(Tensor::K, config.block_n(), k)?,
                v: map(Tensor::V, config.block_n(), v)?,
            })
        } else {
            None
        };
        let bias_map = if config.stages_bias() {
            Some(BiasMap(tma::encode(&bias_map_spec(problem, config.block_m())?, bias)?))
        } else {
            None
        };
        let mut builder = stream.launch_builder(&kernel.function);
        builder.arg(&params);
        if let Some(maps) = &maps {
            builder.arg(maps);
        }
        if let Some(bias_map) = &bias_map {
            builder.arg(bias_map);
        }
        if let Some(work) = &work {
            builder.arg(work);
        }
        // SAFETY: the parameter block matches the kernel's (size asserted on both sides); every
        // address it holds was checked to cover the extent the problem's layouts reach.
        unsafe { builder.launch(cfg) }?;
        Ok(config)
    }

    /// How a launch of the decode kernel `config` splits `problem` on this engine: the forced
    /// count, or the split rule over the loaded kernel's occupancy (compiles or loads it).
    pub fn decode_split_for(&self, problem: &AttentionProblem, config: &CudaDecodeConfig) -> Result<DecodeSplit> {
        let kernel = self.kernel(&CudaKernelConfig::Decode(*config))?;
        decode_split(
            problem,
            config,
            self.device.sm_count(),
            Some(kernel.info.blocks_per_sm),
            self.options.decode_splits,
        )
    }

    /// Enqueues the decode kernel on buffers already checked, and with more than one split the
    /// combine kernel after it (unless the plan fuses it); the split's partial results go to the
    /// engine's scratch.
    fn launch_decode(
        &self,
        problem: &AttentionProblem,
        c: &CudaDecodeConfig,
        bases: [u64; 4],
        lse: u64,
        [page_table, kv_lens]: [u64; 2],
        alibi_slopes: u64,
    ) -> Result<()> {
        let kernel = self.kernel(&CudaKernelConfig::Decode(*c))?;
        let split = decode_split(
            problem,
            c,
            self.device.sm_count(),
            Some(kernel.info.blocks_per_sm),
            self.options.decode_splits,
        )?;
        let geometry = c.geometry(problem, &split)?;
        let combine_geometry = c.combine_geometry(problem)?;
        let stream = self.device.stream();
        let (o_len, lse_len) = split.partial_lens(problem);
        let too_large = || Error::TooLarge("the decode scratch".into());
        let need = usize::try_from(o_len + lse_len).map_err(|_| too_large())?;
        let fused = c.plan.fused && split.splits > 1;
        let need_counters = if fused {
            usize::try_from(decode_counters_len(problem, &split)).map_err(|_| too_large())?
        } else {
            0
        };
        // A poisoned lock only means another thread panicked while holding it; the buffers (or
        // none) are valid at every point.
        let mut scratch = self.decode_scratch.lock().unwrap_or_else(|e| e.into_inner());
        let scratch = &mut *scratch;
        if need > 0 && scratch.partial.as_ref().is_none_or(|s| s.len() < need) {
            // SAFETY: uninitialized f32s; the decode kernel writes every element the combine
            // (kernel or fused) then reads (each row's pieces, chunks below head_dim).
            scratch.partial = Some(unsafe { stream.alloc::<f32>(need) }?);
        }
        if need_counters > 0 && scratch.counters.as_ref().is_none_or(|s| s.len() < need_counters) {
            // Zeroed once: every fused launch leaves them at 0 again.
            scratch.counters = Some(stream.alloc_zeros::<u32>(need_counters)?);
        }
        let mut guards = Vec::new();
        let scratch_ptr = match scratch.partial.as_mut() {
            Some(s) if need > 0 => {
                let (ptr, guard) = s.device_ptr_mut(stream);
                guards.push(guard);
                ptr
            }
            _ => 0,
        };
        let counters_ptr = match scratch.counters.as_mut() {
            Some(s) if need_counters > 0 => {
                let (ptr, guard) = s.device_ptr_mut(stream);
                guards.push(guard);
                ptr
            }
            _ => 0,
        };
        let mut params = DecodeParams::new(problem, bases, lse, scratch_ptr, counters_ptr, &split)
            .with_cache(problem, page_table, kv_lens);
        params.fwd.alibi_slopes = alibi_slopes;
        let launch = |function: &CudaFunction, g: LaunchGeometry| -> Result<()> {
            let mut builder = stream.launch_builder(function);
            builder.arg(&params);
            let cfg = LaunchConfig {
                grid_dim: g.grid,
                block_dim: g.block,
                shared_mem_bytes: g.smem_bytes,
            };
            // SAFETY: the parameter block matches both entry points' (size asserted on both
            // sides); every address it holds was checked to cover the extent the problem's
            // layouts reach, the scratch holds `partial_lens` elements and, for a fused plan,
            // the counters `decode_counters_len` zeros.
            unsafe { builder.launch(cfg) }?;
            Ok(())
        };
        launch(&kernel.function, geometry)?;
        if split.splits > 1 && !fused {
            let combine = kernel.combine.as_ref().ok_or_else(|| Error::Unavailable {
                what: format!("kernel {}", c.combine_name()),
                why: "its module was loaded without the combine entry point".into(),
            })?;
            if self.device.compute_capability().0 >= 9 {
                // SAFETY: as above; the combine waits for the decode kernel's writes
                // (griddepcontrol.wait) before it reads the pieces.
                unsafe { launch_overlapping_previous(&self.device, combine, combine_geometry, &params) }?;
            } else {
                launch(combine, combine_geometry)?;
            }
        }
        drop(guards);
        Ok(())
    }

    /// Enqueues the append of `problem.shape.seq_q` new tokens per sequence into a K/V cache on
    /// your buffers: new token `t` of sequence `b` goes to key position `kv_len(b) − seq_q + t`
    /// (`kv_len` is `kv_lens[b]`, which already counts the new tokens, or `seq_kv`), through the
    /// page table when the cache is paged — the first half of a serving step, whose second half
    /// is [`forward_indexed_device`](Self::forward_indexed_device) (or
    /// [`forward_device`](Self::forward_device)) over the same cache on the same stream. The
    /// index's values are the caller's: positions below 0 and pages past the pool are skipped on
    /// the device (never written out of bounds); the attention call that follows writes such a
    /// sequence as NaN. Of `problem`, the shape, dtype, K/V layouts and cache matter; the kernel
    /// is an entry point of the problem's decode module (`cuda/flash_decode.cu`).
    pub fn append_kv_device<T>(
        &self,
        problem: &AttentionProblem,
        t: AppendTensors<'_, T>,
        index: DeviceBatchIndex<'_>,
    ) -> Result<()> {
        validate_for_decode(problem)?;
        crate::problem::varlen::refuse_packed(problem, "the K/V append")?;
        let index = check_device_index(problem, Some(index), "append_kv_device")?;
        check_element_size::<T>(problem, "new_k")?;
        let es = problem.dtype.size_bytes();
        let s = &problem.shape;
        let new_len = s.batch * s.seq_q * s.num_kv_heads * s.head_dim;
        check_holds([
            ("new_k", t.new_k.len(), new_len),
            ("new_v", t.new_v.len(), new_len),
            ("k_cache", t.k_cache.len(), problem.required_len(Tensor::K)),
            ("v_cache", t.v_cache.len(), problem.required_len(Tensor::V)),
        ])?;
        let config = CudaKernelConfig::for_problem(problem, CudaPlan::Decode(default_decode_plan(s.head_dim)), 16)?;
        let CudaKernelConfig::Decode(decode) = config else {
            return invalid!("the append runs in the decode module");
        };
        let geometry = decode.append_geometry(problem)?;
        let kernel = self.kernel(&config)?;
        let append = kernel.append.as_ref().ok_or_else(|| Error::Unavailable {
            what: format!("kernel {}", decode.append_name()),
            why: "its module was loaded without the append entry point".into(),
        })?;

        let stream = self.device.stream();
        let (new_k, _gk) = t.new_k.device_ptr(stream);
        let (new_v, _gv) = t.new_v.device_ptr(stream);
        let (k_cache, _gkc) = t.k_cache.device_ptr_mut(stream);
        let (v_cache, _gvc) = t.v_cache.device_ptr_mut(stream);
        let (page_table, _gpt) = index_pointer(index.page_table, stream);
        let (kv_lens, _glens) = index_pointer(index.kv_lens, stream);
        let span = |base: u64, elems: usize| (base, base + (elems * es) as u64);
        let written = [
            ("k_cache", span(k_cache, problem.required_len(Tensor::K))),
            ("v_cache", span(v_cache, problem.required_len(Tensor::V))),
        ];
        let mut read = vec![("new_k", span(new_k, new_len)), ("new_v", span(new_v, new_len))];
        if page_table != 0 {
            let len = problem.kv_cache.page_table_len(s.batch);
            read.push(("page_table", (page_table, page_table + 4 * len as u64)));
        }
        if kv_lens != 0 {
            read.push(("kv_lens", (kv_lens, kv_lens + 4 * s.batch as u64)));
        }
        if let Some((a, b)) = first_overlap(&written, &read) {
            return Err(Error::InvalidBuffer {
                tensor: a,
                message: format!("its device memory overlaps `{b}`'s: the append would overwrite what it reads"),
            });
        }
        // The new rows, [batch, seq_q, num_kv_heads, head_dim], in the Q and O slots.
        let row = (s.num_kv_heads * s.head_dim) as i64;
        let fwd = FwdParams::new(problem, [0, k_cache, v_cache, 0], 0);
        let fwd = FwdParams {
            q: new_k,
            o: new_v,
            q_batch_stride: s.seq_q as i64 * row,
            q_seq_stride: row,
            q_head_stride: s.head_dim as i64,
            o_batch_stride: s.seq_q as i64 * row,
            o_seq_stride: row,
            o_head_stride: s.head_dim as i64,
            ..fwd
        };
        let params = DecodeParams {
            fwd,
            ..DecodeParams::default()
        }
        .with_cache(problem, page_table, kv_lens);
        let mut builder = stream.launch_builder(append);
        builder.arg(&params);
        let cfg = LaunchConfig {
            grid_dim: geometry.grid,
            block_dim: geometry.block,
            shared_mem_bytes: 0,
        };
        // SAFETY: the parameter block matches the entry point's (size asserted on both sides);
        // the new rows and the caches were checked to hold the extents the layouts reach, and
        // the kernel writes only cache rows it found inside them.
        unsafe { builder.launch(cfg) }?;
        Ok(())
    }

    /// Host slices in, host vectors out: uploads Q, K and V, runs, waits and reads O and LSE
    /// back. Layouts as the problem says; O elements its layout skips are 0.
    pub fn forward<T: Element>(
        &self,
        problem: &AttentionProblem,
        q: &[T],
        k: &[T],
        v: &[T],
    ) -> Result<AttentionOutput<T>> {
        self.forward_host(problem, q, k, v, None)
    }

    /// [`forward`](Self::forward) for a problem whose K/V cache is paged or has per-sequence key
    /// counts: K and V are the page pools, `index` the page table and counts, checked first
    /// ([`BatchIndex::validate`]: page numbers inside the pool, counts at most `seq_kv`).
    pub fn forward_indexed<T: Element>(
        &self,
        problem: &AttentionProblem,
        q: &[T],
        k: &[T],
        v: &[T],
        index: &BatchIndex<'_>,
    ) -> Result<AttentionOutput<T>> {
        self.forward_host(problem, q, k, v, Some(index))
    }

    fn forward_host<T: Element>(
        &self,
        problem: &AttentionProblem,
        q: &[T],
        k: &[T],
        v: &[T],
        index: Option<&BatchIndex<'_>>,
    ) -> Result<AttentionOutput<T>> {
        validate_for(problem, self.options.plan)?;
        match index {
            Some(index) => index.validate(problem)?,
            None => refuse_cached(problem, "forward_indexed")?,
        }
        let [dq, dk, dv] = self.upload_qkv(problem, [q, k, v])?;
        let stream = self.device.stream();
        let o_len = problem.required_len(Tensor::O);
        let mut d_o = stream.alloc_zeros::<u16>(o_len)?;
        let mut d_lse = stream.alloc_zeros::<f32>(problem.lse_len())?;
        let upload = |x: Option<&[u32]>| x.map(|x| stream.clone_htod(x)).transpose();
        let d_table = upload(index.and_then(|i| i.page_table))?;
        let d_lens = upload(index.and_then(|i| i.kv_lens))?;
        let d_cu_q = upload(index.and_then(|i| i.cu_seqlens_q))?;
        let d_cu_k = upload(index.and_then(|i| i.cu_seqlens_k))?;
        let upload_f32 = |x: Option<&[f32]>| x.map(|x| stream.clone_htod(x)).transpose();
        let d_slopes = upload_f32(index.and_then(|i| i.alibi_slopes))?;
        let d_sinks = upload_f32(index.and_then(|i| i.sinks))?;
        // 16-bit biases travel as their bits, like Q/K/V.
        let bias = index.and_then(|i| i.bias);
        let d_bias32 = upload_f32(bias.and_then(|b| match b {
            BiasValues::F32(x) => Some(x),
            _ => None,
        }))?;
        let d_bias16 = match bias {
            Some(BiasValues::F16(x)) => Some(stream.clone_htod(bytemuck::cast_slice::<half::f16, u16>(x))?),
            Some(BiasValues::BF16(x)) => Some(stream.clone_htod(bytemuck::cast_slice::<half::bf16, u16>(x))?),
            _ => None,
        };
        let tensors = DeviceTensors {
            q: &dq,
            k: &dk,
            v: &dv,
            o: &mut d_o,
            lse: Some(&mut d_lse),
        };
        let config = match index {
            Some(_) => self.forward_indexed_device(
                problem,
                tensors,
                DeviceBatchIndex {
                    cu_seqlens_q: d_cu_q.as_ref().map(|t| t as &dyn DevicePtr<u32>),
                    cu_seqlens_k: d_cu_k.as_ref().map(|t| t as &dyn DevicePtr<u32>),
                    page_table: d_table.as_ref().map(|t| t as &dyn DevicePtr<u32>),
                    kv_lens: d_lens.as_ref().map(|t| t as &dyn DevicePtr<u32>),
                    alibi_slopes: d_slopes.as_ref().map(|t| t as &dyn DevicePtr<f32>),
                    sinks: d_sinks.as_ref().map(|t| t as &dyn DevicePtr<f32>),
                    bias: match (bias, &d_bias32, &d_bias16) {
                        (Some(_), Some(t), _) => Some(DeviceBias::F32(t)),
                        (Some(BiasValues::F16(_)), _, Some(t)) => Some(DeviceBias::F16(t)),
                        (Some(BiasValues::BF16(_)), _, Some(t)) => Some(DeviceBias::BF16(t)),
                        _ => None,
                    },
                },
            )?,
            None => self.forward_device(problem, tensors)?,
        };
        let out_bits: Vec<u16> = stream.clone_dtoh(&d_o)?;
        let lse: Vec<f32> = stream.clone_dtoh(&d_lse)?;
        let device_bytes = 2 * (dq.len() + dk.len() + dv.len() + o_len) as u64 + 4 * lse.len() as u64;
        Ok(AttentionOutput {
            out: bytemuck::cast_slice::<u16, T>(&out_bits).to_vec(),
            lse,
            kernel: config.name(),
            device_bytes,
        })
    }
}

impl CudaAttention {
    /// Host Q, K and V checked (the problem's dtype, long enough for their layouts) and copied to
    /// the device: the host-slice calls' first step.
    pub(super) fn upload_qkv<T: Element>(
        &self,
        problem: &AttentionProblem,
        qkv: [&[T]; 3],
    ) -> Result<[CudaSlice<u16>; 3]> {
        if T::DTYPE != problem.dtype {
            return Err(Error::DTypeMismatch {
                tensor: "q",
                expected: problem.dtype,
                got: T::DTYPE,
            });
        }
        let [q, k, v] = qkv;
        check_lengths(
            problem,
            [(Tensor::Q, q.len()), (Tensor::K, k.len()), (Tensor::V, v.len())],
        )?;
        let stream = self.device.stream();
        // bf16/f16 travel as their bit patterns: cudarc's DeviceRepr covers u16, not half's types.
        let up = |x: &[T]| stream.clone_htod(bytemuck::cast_slice::<T, u16>(x));
        Ok([up(q)?, up(k)?, up(v)?])
    }
}

/// An LSE buffer of `len` values (none: not written) holds the problem's rows.
pub(super) fn check_lse_len(problem: &AttentionProblem, len: Option<usize>) -> Result<()> {
    len.map_or(Ok(()), |len| check_holds([("lse", len, problem.lse_len())]))
}

/// The device address of an index tensor (0 for none) and the guard that orders the launch
/// after earlier writes to it.
fn index_pointer<'a, T>(
    tensor: Option<&'a dyn DevicePtr<T>>,
    stream: &'a std::sync::Arc<cudarc::driver::CudaStream>,
) -> (u64, Option<cudarc::driver::SyncOnDrop<'a>>) {
    match tensor {
        Some(t) => {
            let (p, g) = t.device_ptr(stream);
            (p, Some(g))
        }
        None => (0, None),
    }
}

/// The device address of an output that may be absent (0 for none), and the guard that orders the
/// launch after earlier uses of it.
pub(super) fn output_pointer<'a, 'b: 'a, T>(
    tensor: Option<&'a mut (dyn DevicePtrMut<T> + 'b)>,
    stream: &'a std::sync::Arc<cudarc::driver::CudaStream>,
) -> (u64, Option<cudarc::driver::SyncOnDrop<'a>>) {
    match tensor {
        Some(t) => {
            let (p, g) = t.device_ptr_mut(stream);
            (p, Some(g))
        }
        None => (0, None),
    }
}

/// A forward's device tensors against `problem`: 16-bit elements of its dtype, each long enough
/// for its layout, the LSE (when given) for its rows.
pub(super) fn check_device_tensors<T>(problem: &AttentionProblem, t: &DeviceTensors<'_, T>) -> Result<()> {
    check_element_size::<T>(problem, "q")?;
    check_lengths(
        problem,
        [
            (Tensor::Q, t.q.len()),
            (Tensor::K, t.k.len()),
            (Tensor::V, t.v.len()),
            (Tensor::O, t.o.len()),
        ],
    )?;
    check_lse_len(problem, t.lse.as_ref().map(|l| l.len()))
}

/// An error for a problem that needs index tensors (a cache's, a packed batch's, per-head tensors,
/// a bias), reached through an entry point that takes none: it names `entry`, the one to use.
fn refuse_cached(problem: &AttentionProblem, entry: &str) -> Result<()> {
    let cache = &problem.kv_cache;
    if problem.varlen.is_some() {
        return invalid!("the problem is a packed (varlen) batch: pass its row offsets with `{entry}`");
    }
    if problem.has_head_tensors() || problem.bias.is_some() {
        return invalid!(
            "the problem reads per-head tensors (ALiBi slopes, sinks) or a score bias: pass them with `{entry}`"
        );
    }
    if cache.is_plain() {
        return Ok(());
    }
    let what = match (cache.paged.is_some(), cache.lengths) {
        (true, true) => "paged with per-sequence key counts",
        (true, false) => "paged",
        _ => "given per-sequence key counts",
    };
    invalid!("the problem's K/V cache is {what}: pass its page table and key counts with `{entry}`")
}

/// The device cache index of a launch, checked against the problem: `None` only for a plain
/// cache (else an error naming `entry`); each tensor present exactly when the problem asks for
/// it, and long enough.
fn check_device_index<'a>(
    problem: &AttentionProblem,
    index: Option<DeviceBatchIndex<'a>>,
    entry: &str,
) -> Result<DeviceBatchIndex<'a>> {
    let Some(index) = index else {
        refuse_cached(problem, entry)?;
        return Ok(DeviceBatchIndex::default());
    };
    let cache = &problem.kv_cache;
    let batch = problem.shape.batch;
    let bad = |tensor, message: String| Err(Error::InvalidBuffer { tensor, message });
    for (tensor, wanted, given, need) in [
        (
            "page_table",
            cache.paged.is_some(),
            index.page_table.map(|t| t.len()),
            cache.page_table_len(batch),
        ),
        ("kv_lens", cache.lengths, index.kv_lens.map(|t| t.len()), batch),
        (
            "cu_seqlens_q",
            problem.varlen.is_some(),
            index.cu_seqlens_q.map(|t| t.len()),
            batch + 1,
        ),
        (
            "cu_seqlens_k",
            problem.varlen.is_some(),
            index.cu_seqlens_k.map(|t| t.len()),
            batch + 1,
        ),
        (
            "alibi_slopes",
            problem.has_alibi_tensor(),
            index.alibi_slopes.map(|t| t.len()),
            problem.shape.num_heads,
        ),
        (
            "sinks",
            problem.sinks,
            index.sinks.map(|t| t.len()),
            problem.shape.num_heads,
        ),
        (
            "bias",
            problem.bias.is_some(),
            index.bias.map(|b| b.len()),
            problem
                .bias
                .map_or(0, |b| b.required_len(problem).unwrap_or(usize::MAX)),
        ),
    ] {
        match (wanted, given) {
            (true, None) => return bad(tensor, "missing: the problem needs it".into()),
            (false, Some(_)) => return bad(tensor, "given for a problem that does not use it".into()),
            (true, Some(len)) if len < need => {
                return bad(tensor, format!("holds {len} entries, the problem needs {need}"))
            }
            _ => {}
        }
    }
    if let (Some(want), Some(given)) = (problem.bias, index.bias) {
        if want.dtype != given.dtype() {
            return bad(
                "bias",
                format!(
                    "holds {} values, the problem's bias is {}",
                    given.dtype().name(),
                    want.dtype.name()
                ),
            );
        }
    }
    Ok(index)
}

/// The checks of the kernel a problem goes to: the decode kernel's (any head_dim validation
/// admits) when `forced` is a decode plan, or when nothing is forced and selection sends it there;
/// else the prefill kernels'.
pub(super) fn validate_for(problem: &AttentionProblem, forced: Option<CudaPlan>) -> Result<()> {
    problem.validate()?;
    let decode = match forced {
        Some(plan) => matches!(plan, CudaPlan::Decode(_)),
        None => goes_to_decode(problem),
    };
    if decode {
        validate_for_decode(problem)
    } else {
        validate_for_cuda(problem)
    }
}

/// The byte ranges Q, K and V span from their device addresses (the problem's extents), for
/// [`check_outputs_apart`].
pub(super) fn input_extents(problem: &AttentionProblem, [q, k, v]: [u64; 3]) -> [(&'static str, (u64, u64)); 3] {
    let es = problem.dtype.size_bytes() as u64;
    let extent = |tensor: Tensor, base: u64| (base, base + problem.required_len(tensor) as u64 * es);
    [
        ("q", extent(Tensor::Q, q)),
        ("k", extent(Tensor::K, k)),
        ("v", extent(Tensor::V, v)),
    ]
}

/// Refuses a forward whose outputs overlap: O (the problem's extent from address `o`) and the LSE
/// (from `lse`; 0 for none) against each other and against each tensor `read` names.
pub(super) fn check_outputs_apart(
    problem: &AttentionProblem,
    o: u64,
    lse: u64,
    read: &[(&'static str, (u64, u64))],
) -> Result<()> {
    let es = problem.dtype.size_bytes() as u64;
    let written = [
        ("o", (o, o + problem.required_len(Tensor::O) as u64 * es)),
        ("lse", (lse, lse + 4 * problem.lse_len() as u64)),
    ];
    let written = if lse == 0 { &written[..1] } else { &written[..] };
    match first_overlap(written, read) {
        Some((a, b)) => Err(Error::InvalidBuffer {
            tensor: a,
            message: format!(
                "its device memory overlaps `{b}`'s: the kernel would overwrite what it reads (or write one \
                 result over another)"
            ),
        }),
        None => Ok(()),
    }
}

/// Threads per CTA of the element walk (`cuda/element_walk.cuh`'s `ELEMENT_WALK_THREADS`).
const ELEMENT_WALK_THREADS: u32 = 256;

/// The most CTAs one element-wise launch asks for; the kernels stride over the rest. 2^16 CTAs of
/// 256 threads fill any GPU many times over.
const ELEMENT_WALK_MAX_CTAS: u64 = 1 << 16;

/// The launch shape of an element-wise kernel over `elements` elements.
pub(super) fn element_walk_launch(elements: u64) -> LaunchConfig {
    let ctas = elements
        .div_ceil(ELEMENT_WALK_THREADS as u64)
        .clamp(1, ELEMENT_WALK_MAX_CTAS);
    LaunchConfig {
        grid_dim: (ctas as u32, 1, 1),
        block_dim: (ELEMENT_WALK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The first pair of byte ranges `[start, end)` that overlap: a written range with another
/// written one or with a read one (reads may overlap each other: packed QKV, broadcast K/V).
pub(super) fn first_overlap(
    written: &[(&'static str, (u64, u64))],
    read: &[(&'static str, (u64, u64))],
) -> Option<(&'static str, &'static str)> {
    let overlaps = |(a0, a1): (u64, u64), (b0, b1): (u64, u64)| a0 < b1 && b0 < a1;
    for (i, &(name, range)) in written.iter().enumerate() {
        let others = written[i + 1..].iter().chain(read);
        if let Some(&(other, _)) = others.into_iter().find(|(_, r)| overlaps(range, *r)) {
            return Some((name, other));
        }
    }
    None
}

/// Device buffers of `T` hold elements of the problem's dtype's size (`tensor` names the first).
pub(super) fn check_element_size<T>(problem: &AttentionProblem, tensor: &'static str) -> Result<()> {
    if std::mem::size_of::<T>() != problem.dtype.size_bytes() {
        return Err(Error::InvalidBuffer {
            tensor,
            message: format!(
                "device buffers hold {}-byte elements; {} needs {}",
                std::mem::size_of::<T>(),
                problem.dtype.name(),
                problem.dtype.size_bytes()
            ),
        });
    }
    Ok(())
}

/// Each buffer holds at least the elements its tensor's layout reaches.
pub(super) fn check_lengths<const N: usize>(problem: &AttentionProblem, lengths: [(Tensor, usize); N]) -> Result<()> {
    check_holds(lengths.map(|(t, len)| (t.name(), len, problem.required_len(t))))
}

/// Enqueues `function` with the single parameter block `params` on `device`'s stream as a
/// programmatic dependent launch (sm_90 and newer): the GPU may start launching its CTAs before
/// the previous kernel on the stream has finished, and each CTA waits in
/// `griddepcontrol.wait` until that kernel has completed and its writes are visible. What
/// overlaps is the launch latency, never the work; a kernel without the wait must not be
/// launched this way.
///
/// # Safety
/// `params` must be the kernel's whole parameter block, and every address in it valid for what
/// the kernel reads and writes (as for `LaunchArgs::launch`).
unsafe fn launch_overlapping_previous<P: DeviceRepr>(
    device: &CudaDevice,
    function: &CudaFunction,
    g: LaunchGeometry,
    params: &P,
) -> Result<()> {
    use cudarc::driver::sys;
    let mut attribute = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        // SAFETY: an all-zero union is a valid value of each of its plain-integer members.
        value: unsafe { std::mem::zeroed() },
    };
    attribute.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: g.grid.0,
        gridDimY: g.grid.1,
        gridDimZ: g.grid.2,
        blockDimX: g.block.0,
        blockDimY: g.block.1,
        blockDimZ: g.block.2,
        sharedMemBytes: g.smem_bytes,
        hStream: device.stream().cu_stream(),
        attrs: &mut attribute,
        numAttrs: 1,
    };
    let mut args = [params as *const P as *mut std::ffi::c_void];
    device.context().bind_to_thread()?;
    // SAFETY: the configuration and its attribute outlive the call; `args` holds the address of
    // the one parameter block, which the caller vouches for.
    unsafe { sys::cuLaunchKernelEx(&config, function.cu_function(), args.as_mut_ptr(), std::ptr::null_mut()) }
        .result()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::first_overlap;

    #[test]
    fn written_ranges_must_not_overlap_anything_and_reads_may_share() {
        let q = ("q", (0, 100));
        let k = ("k", (50, 150)); // packed with q: reads may overlap
        let o_apart = ("o", (200, 300));
        let lse_apart = ("lse", (300, 340)); // touching o's end is not overlapping
        assert_eq!(first_overlap(&[o_apart, lse_apart], &[q, k]), None);
        assert_eq!(first_overlap(&[("o", (99, 120))], &[q, k]), Some(("o", "q")));
        assert_eq!(first_overlap(&[("o", (140, 160))], &[q, k]), Some(("o", "k")));
        assert_eq!(first_overlap(&[o_apart, ("lse", (250, 260))], &[q]), Some(("o", "lse")));
        assert_eq!(first_overlap(&[o_apart, ("lse", (0, 4))], &[q]), Some(("lse", "q")));
    }
}
