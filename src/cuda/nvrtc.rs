//! Turning `cuda/*.cu` into a loadable cubin: the source table, NVRTC options, and a two-level
//! cache (the engine keeps loaded modules in memory; this module keeps cubins on disk) so that a
//! second process skips the compile.
//!
//! NVRTC is called directly through cudarc's raw bindings rather than its `compile_ptx`
//! helper because we need the cubin (not PTX, which the driver would compile again at every
//! load), the log of a successful compile (ptxas's register and spill report), our own headers,
//! and errors instead of the panics cudarc's helper has on some paths.

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::time::Instant;

use cudarc::nvrtc::sys;

use super::plan::CudaKernelConfig;
use crate::error::{Error, Result};

/// A CUDA source file compiled into the library.
#[derive(Clone, Copy, Debug)]
pub struct Source {
    /// The name `#include` uses and NVRTC reports errors against.
    pub name: &'static str,
    pub text: &'static str,
}

/// The FlashAttention-2 style forward kernel on `mma.sync` (one entry point per config).
pub const FLASH_FWD_MMA: Source = Source {
    name: "flash_fwd_mma.cu",
    text: include_str!("../../cuda/flash_fwd_mma.cu"),
};

/// Inline-PTX helpers the kernels include.
pub const MMA_PTX: Source = Source {
    name: "mma_ptx.cuh",
    text: include_str!("../../cuda/mma_ptx.cuh"),
};

/// Headers every program may include, by name (NVRTC sees nothing else: no toolkit headers).
pub const HEADERS: [Source; 1] = [MMA_PTX];

/// Bumped when the cache's file format or key changes.
const CACHE_FORMAT: &str = "wgpu-flash-attn cubin v1";

/// One NVRTC compile: which source, for which GPU, with which options.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileJob {
    /// The kernel's entry point, also the program name in NVRTC's messages.
    pub kernel: String,
    pub source: &'static str,
    pub source_name: &'static str,
    /// `sm_90a`, `sm_80`, ...
    pub arch: String,
    pub options: Vec<String>,
}

impl CompileJob {
    /// The forward kernel for `config` on `arch`.
    pub fn forward(config: &CudaKernelConfig, arch: &str) -> Self {
        let mut options = vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".to_string(),
            // ptxas's resource report lands in the log: registers, spills, shared memory.
            "--ptxas-options=-v".to_string(),
            // Line tables for profilers; no effect on the code.
            "-lineinfo".to_string(),
        ];
        options.extend(config.defines());
        CompileJob {
            kernel: config.name(),
            source: FLASH_FWD_MMA.text,
            source_name: FLASH_FWD_MMA.name,
            arch: arch.to_string(),
            options,
        }
    }

    /// Disk-cache key: everything that can change the cubin, hashed with a fixed function (FNV-1a)
    /// so that it is the same in every process and build.
    pub fn cache_key(&self, nvrtc_version: (i32, i32), driver_version: i32) -> u64 {
        let mut h = Fnv1a::new();
        h.write_str(CACHE_FORMAT);
        h.write_str(&format!(
            "nvrtc {}.{} driver {driver_version}",
            nvrtc_version.0, nvrtc_version.1
        ));
        h.write_str(&self.kernel);
        h.write_str(&self.arch);
        for o in &self.options {
            h.write_str(o);
        }
        h.write_str(self.source_name);
        h.write_str(self.source);
        for header in HEADERS {
            h.write_str(header.name);
            h.write_str(header.text);
        }
        h.finish()
    }

    /// File name of the cached cubin: readable prefix, then the key.
    pub fn cache_file_name(&self, key: u64) -> String {
        format!("{}-{}-{key:016x}.cubin", self.kernel, self.arch)
    }
}

/// 64-bit FNV-1a: stable across processes, platforms and Rust versions (std's hasher is not).
struct Fnv1a(u64);

impl Fnv1a {
    fn new() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    /// Length-prefixed, so that ("ab", "c") and ("a", "bc") hash differently.
    fn write_str(&mut self, s: &str) {
        self.write(&(s.len() as u64).to_le_bytes());
        self.write(s.as_bytes());
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Where compiled kernels are kept between processes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DiskCache {
    /// `$WGPU_FLASH_ATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/wgpu-flash-attn/cuda`, else
    /// `$HOME/.cache/wgpu-flash-attn/cuda`; none if no variable is set.
    #[default]
    Default,
    Dir(PathBuf),
    /// Compile in every process.
    Off,
}

impl DiskCache {
    /// The directory this setting names, if any (not created yet).
    pub fn dir(&self) -> Option<PathBuf> {
        match self {
            DiskCache::Off => None,
            DiskCache::Dir(d) => Some(d.clone()),
            DiskCache::Default => default_cache_dir(|k| std::env::var_os(k)),
        }
    }
}

/// The default cache directory given an environment lookup (a parameter, for tests).
pub fn default_cache_dir(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let non_empty = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = non_empty("WGPU_FLASH_ATTN_CACHE_DIR") {
        return Some(d);
    }
    if let Some(d) = non_empty("XDG_CACHE_HOME") {
        return Some(d.join("wgpu-flash-attn").join("cuda"));
    }
    non_empty("HOME").map(|h| h.join(".cache").join("wgpu-flash-attn").join("cuda"))
}

/// Where a kernel's binary came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Origin {
    /// NVRTC compiled it in this process, taking this long.
    Compiled { millis: f64 },
    /// Read from the disk cache.
    DiskCache,
}

/// A cubin and what the compiler said about it.
#[derive(Clone, Debug)]
pub struct CompiledKernel {
    pub cubin: Vec<u8>,
    /// NVRTC's log, with ptxas's resource report (empty when read from the disk cache).
    pub log: String,
    pub origin: Origin,
    /// The cache file it was read from or written to.
    pub cache_path: Option<PathBuf>,
}

/// True when libnvrtc can be loaded (checked before any NVRTC call: cudarc panics otherwise).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

fn require_nvrtc() -> Result<()> {
    if nvrtc_available() {
        Ok(())
    } else {
        Err(Error::Unavailable {
            what: "NVRTC (libnvrtc.so), needed to compile the CUDA kernels".into(),
            why: "the library was not found; install the CUDA toolkit's NVRTC (or the \
                  nvidia-cuda-nvrtc wheel) and put its lib directory on LD_LIBRARY_PATH, e.g. \
                  /usr/local/cuda/targets/x86_64-linux/lib"
                .into(),
        })
    }
}

/// NVRTC's version, `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to live integers.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    check(r, "nvrtcVersion", "")?;
    Ok((major, minor))
}

fn check(r: sys::nvrtcResult, call: &str, name: &str) -> Result<()> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::Nvrtc {
            name: name.to_string(),
            log: format!("{call} returned {r:?}"),
        })
    }
}

/// Destroys the program however compilation ends.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed once; a failure only leaks.
        unsafe {
            let _ = sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

fn c_string(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Nvrtc {
        name: what.to_string(),
        log: "contains a NUL byte".into(),
    })
}

/// Compiles a job to a cubin with NVRTC; returns the cubin and the compile log.
pub fn compile_cubin(job: &CompileJob) -> Result<(Vec<u8>, String)> {
    require_nvrtc()?;
    // One compile at a time per process: on the H200, ptxas's `-v` report went missing from the
    // log of a compile that ran beside another one in the same process. Compiles are rare (once
    // per config, then the caches), so nothing is lost.
    static COMPILING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = COMPILING.lock().unwrap_or_else(|e| e.into_inner());
    let src = c_string(job.source, job.source_name)?;
    let name = c_string(job.source_name, job.source_name)?;
    let header_texts: Vec<CString> = HEADERS
        .iter()
        .map(|h| c_string(h.text, h.name))
        .collect::<Result<_>>()?;
    let header_names: Vec<CString> = HEADERS
        .iter()
        .map(|h| c_string(h.name, h.name))
        .collect::<Result<_>>()?;
    let header_text_ptrs: Vec<*const c_char> = header_texts.iter().map(|s| s.as_ptr()).collect();
    let header_name_ptrs: Vec<*const c_char> = header_names.iter().map(|s| s.as_ptr()).collect();
    let options: Vec<CString> = job
        .options
        .iter()
        .map(|o| c_string(o, &job.kernel))
        .collect::<Result<_>>()?;
    let option_ptrs: Vec<*const c_char> = options.iter().map(|s| s.as_ptr()).collect();

    let mut raw = std::ptr::null_mut();
    // SAFETY: every pointer refers to a NUL-terminated string that outlives the program.
    let r = unsafe {
        sys::nvrtcCreateProgram(
            &mut raw,
            src.as_ptr(),
            name.as_ptr(),
            HEADERS.len() as i32,
            header_text_ptrs.as_ptr(),
            header_name_ptrs.as_ptr(),
        )
    };
    check(r, "nvrtcCreateProgram", &job.kernel)?;
    let program = Program(raw);
    // SAFETY: the program is live; the option pointers outlive the call.
    let compiled = unsafe { sys::nvrtcCompileProgram(program.0, option_ptrs.len() as i32, option_ptrs.as_ptr()) };
    let log = program_log(&program);
    if compiled != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Nvrtc {
            name: job.kernel.clone(),
            log: format!("{compiled:?} with options {:?}\n{log}", job.options),
        });
    }
    let mut size = 0usize;
    // SAFETY: the program compiled; `size` is a live out-pointer.
    check(
        unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) },
        "nvrtcGetCUBINSize",
        &job.kernel,
    )?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has the size NVRTC reported.
    check(
        unsafe { sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr() as *mut c_char) },
        "nvrtcGetCUBIN",
        &job.kernel,
    )?;
    if cubin.is_empty() {
        return Err(Error::Nvrtc {
            name: job.kernel.clone(),
            log: format!(
                "NVRTC produced no cubin for {} (a virtual architecture?)\n{log}",
                job.arch
            ),
        });
    }
    Ok((cubin, log))
}

fn program_log(program: &Program) -> String {
    let mut size = 0usize;
    // SAFETY: live program and out-pointer.
    if unsafe { sys::nvrtcGetProgramLogSize(program.0, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return String::new();
    }
    let mut buf = vec![0 as c_char; size];
    // SAFETY: `buf` has the reported size, which includes the terminating NUL.
    if unsafe { sys::nvrtcGetProgramLog(program.0, buf.as_mut_ptr()) } != sys::nvrtcResult::NVRTC_SUCCESS {
        return String::new();
    }
    // SAFETY: NVRTC NUL-terminates the log within `size` bytes.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .trim()
        .to_string()
}

/// The cubin for `job`: from `cache_dir` when a previous process left it there, else compiled
/// (and then stored there). Cache failures never fail the call: the cache is an optimization.
pub fn load_or_compile(job: &CompileJob, cache_dir: Option<&Path>, driver_version: i32) -> Result<CompiledKernel> {
    let path = match cache_dir {
        Some(dir) if nvrtc_available() => {
            let key = job.cache_key(nvrtc_version()?, driver_version);
            Some(dir.join(job.cache_file_name(key)))
        }
        _ => None,
    };
    if let Some(path) = &path {
        if let Ok(cubin) = std::fs::read(path) {
            if !cubin.is_empty() {
                return Ok(CompiledKernel {
                    cubin,
                    log: String::new(),
                    origin: Origin::DiskCache,
                    cache_path: Some(path.clone()),
                });
            }
        }
    }
    let start = Instant::now();
    let (cubin, log) = compile_cubin(job)?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    if let Some(path) = &path {
        store(path, &cubin);
    }
    Ok(CompiledKernel {
        cubin,
        log,
        origin: Origin::Compiled { millis },
        cache_path: path,
    })
}

/// Writes atomically (temporary file, then rename) so that a concurrent reader never sees half
/// a cubin; errors are ignored.
fn store(path: &Path, bytes: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Removes a cached cubin that the driver refused (stale or damaged), so the next load compiles.
pub fn evict(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// ptxas's report for the kernel, e.g. `Used 168 registers, used 1 barriers, 0 bytes spill
/// stores`, pulled out of an NVRTC log (empty if the log has none).
pub fn resource_report(log: &str) -> String {
    log.lines()
        .filter(|l| l.contains("Used") || l.contains("spill"))
        .map(|l| l.trim_start_matches("ptxas info    :").trim())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::plan::{all_cuda_configs, CudaKernelConfig, CudaTilePlan};
    use crate::problem::DType;
    use std::ffi::OsString;

    fn config() -> CudaKernelConfig {
        CudaKernelConfig::new(
            DType::BF16,
            128,
            CudaTilePlan {
                block_m: 64,
                block_n: 64,
                warps: 4,
            },
            false,
            16,
        )
        .unwrap()
    }

    #[test]
    fn jobs_name_the_kernel_and_target_the_arch() {
        let job = CompileJob::forward(&config(), "sm_90a");
        assert_eq!(job.kernel, "flash_fwd_mma_bf16_d128_bm64_bn64_w4");
        assert!(job.options.contains(&"--gpu-architecture=sm_90a".to_string()));
        assert!(job
            .options
            .contains(&"-DKERNEL_NAME=flash_fwd_mma_bf16_d128_bm64_bn64_w4".to_string()));
        assert!(job.source.contains("KERNEL_NAME"));
        // The kernel includes exactly the headers we hand NVRTC, and nothing from a toolkit.
        for line in job.source.lines().chain(MMA_PTX.text.lines()) {
            if let Some(rest) = line.trim().strip_prefix("#include") {
                let name = rest.trim().trim_matches('"');
                assert!(HEADERS.iter().any(|h| h.name == name), "unknown include {name}");
            }
        }
    }

    #[test]
    fn cache_keys_change_with_everything_that_changes_the_binary() {
        let job = CompileJob::forward(&config(), "sm_90a");
        let key = job.cache_key((13, 0), 13000);
        assert_eq!(key, job.clone().cache_key((13, 0), 13000), "stable");
        assert_ne!(key, job.cache_key((13, 1), 13000), "NVRTC version");
        assert_ne!(key, job.cache_key((13, 0), 13010), "driver version");
        assert_ne!(
            key,
            CompileJob::forward(&config(), "sm_80").cache_key((13, 0), 13000),
            "arch"
        );
        let mut other = job.clone();
        other.options.push("-DX=1".into());
        assert_ne!(key, other.cache_key((13, 0), 13000), "options");
        let mut keys: Vec<u64> = all_cuda_configs()
            .iter()
            .map(|c| CompileJob::forward(c, "sm_90a").cache_key((13, 0), 13000))
            .collect();
        let n = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), n, "every config has its own key");
        let file = job.cache_file_name(key);
        assert!(file.starts_with("flash_fwd_mma_bf16_d128_bm64_bn64_w4-sm_90a-") && file.ends_with(".cubin"));
        // FNV-1a of the empty input is its offset basis: the hash is the published function.
        assert_eq!(Fnv1a::new().finish(), 0xcbf2_9ce4_8422_2325);
    }

    #[test]
    fn default_cache_dir_follows_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v))
        };
        assert_eq!(
            default_cache_dir(env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/wgpu-flash-attn/cuda"))
        );
        assert_eq!(
            default_cache_dir(env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")])),
            Some(PathBuf::from("/x/wgpu-flash-attn/cuda"))
        );
        assert_eq!(
            default_cache_dir(env(&[("XDG_CACHE_HOME", "/x"), ("WGPU_FLASH_ATTN_CACHE_DIR", "/c")])),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(default_cache_dir(env(&[("XDG_CACHE_HOME", "")])), None);
        assert_eq!(DiskCache::Off.dir(), None);
        assert_eq!(DiskCache::Dir("/d".into()).dir(), Some(PathBuf::from("/d")));
    }

    #[test]
    fn resource_report_keeps_the_ptxas_lines() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
                   ptxas info    : Used 168 registers, used 1 barriers, 160 bytes cmem[0]\n\
                   ptxas info    : Function properties for k\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads";
        let r = resource_report(log);
        assert!(
            r.contains("Used 168 registers") && r.contains("0 bytes spill stores"),
            "{r}"
        );
    }

    #[test]
    fn missing_nvrtc_is_an_error_not_a_panic() {
        if nvrtc_available() {
            return; // covered by the compile test in tests/cuda_attention.rs
        }
        let err = compile_cubin(&CompileJob::forward(&config(), "sm_90a")).unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err}");
        assert!(err.to_string().contains("LD_LIBRARY_PATH"), "{err}");
        assert!(nvrtc_version().is_err());
    }
}
