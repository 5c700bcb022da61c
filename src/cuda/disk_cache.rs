//! The disk half of the kernel cache: where cubins live between processes, how a file is read
//! back and written. Compiling and loading are closures, so nothing here needs cudarc or a GPU
//! and every path through it is tested on temporary directories.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::error::Result;

/// Where compiled kernels are kept between processes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DiskCache {
    /// `$WGPU_FLASH_ATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/wgpu-flash-attn/cuda`, else
    /// `$HOME/.cache/wgpu-flash-attn/cuda`; none if no variable is set.
    #[default]
    Default,
    /// This directory (created on the first store).
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

/// What the disk cache did for one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheStatus {
    /// No cache directory ([`DiskCache::Off`], or no variable names one): compiled here.
    Off,
    /// Read from this file.
    Hit(PathBuf),
    /// Compiled, then written to this file; `replaced` says why a file already there was not
    /// used.
    Stored { path: PathBuf, replaced: Option<String> },
    /// Compiled and kept in memory only: why the cache could not be used or written.
    Bypassed { why: String },
}

/// One cache file: its name inside the cache directory, and the key it is stored under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub file_name: String,
    pub key: u64,
}

/// A loaded kernel and how it was obtained.
#[derive(Debug)]
pub struct Fetched<T> {
    /// What `load` made of the binary.
    pub value: T,
    /// The compiler's log (empty on a cache hit).
    pub log: String,
    pub origin: Origin,
    pub cache: CacheStatus,
}

/// The kernel of `entry`: `load` applied to the cubin cached in `dir`, or, when there is none,
/// to a fresh `compile`, which is then stored. Cache failures never fail the call.
pub fn fetch<T>(
    dir: Option<&Path>,
    entry: &Entry,
    compile: impl FnOnce() -> Result<(Vec<u8>, String)>,
    mut load: impl FnMut(&[u8]) -> Result<T>,
) -> Result<Fetched<T>> {
    let path = dir.map(|d| d.join(&entry.file_name));
    if let Some(path) = &path {
        // A cached cubin the loader refuses is evicted and looked up again.
        for attempt in 0..2 {
            let Ok(cubin) = std::fs::read(path) else { break };
            if cubin.is_empty() {
                break;
            }
            match load(&cubin) {
                Ok(value) => {
                    return Ok(Fetched {
                        value,
                        log: String::new(),
                        origin: Origin::DiskCache,
                        cache: CacheStatus::Hit(path.clone()),
                    })
                }
                Err(e) if attempt == 1 => return Err(e),
                Err(_) => evict(path),
            }
        }
    }
    let start = Instant::now();
    let (cubin, log) = compile()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let value = load(&cubin)?;
    let cache = match &path {
        None => CacheStatus::Off,
        Some(path) => {
            store(path, &cubin);
            CacheStatus::Stored {
                path: path.clone(),
                replaced: None,
            }
        }
    };
    Ok(Fetched {
        value,
        log,
        origin: Origin::Compiled { millis },
        cache,
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
fn evict(path: &Path) {
    let _ = std::fs::remove_file(path);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

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
}
