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
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir).and_then(|()| write_atomically(path, &cubin));
            }
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

/// Writes `bytes` to `path` atomically, so that a concurrent reader sees the old file or the
/// new one and nothing planted in the directory is written through: into a new file beside it
/// (created exclusively and private, under a name no other writer uses), flushed to disk, then
/// renamed over `path`, which replaces whatever is there, a symlink included, without following
/// it.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::other("not a file path"));
    };
    let mut attempts = 0;
    let (tmp, mut file) = loop {
        let tmp = dir.join(temp_name(name));
        match create_new(&tmp) {
            Ok(file) => break (tmp, file),
            // Someone planted this name: take another (each try's name is new).
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempts < 8 => attempts += 1,
            Err(e) => return Err(e),
        }
    };
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    } else if let Ok(d) = std::fs::File::open(dir) {
        // Makes the rename itself durable; a failure only risks an older file after a crash.
        let _ = d.sync_all();
    }
    written
}

/// A temporary name no other writer (process or thread) picks: process id, time and a counter,
/// hidden, beside the final name.
fn temp_name(final_name: &std::ffi::OsStr) -> std::ffi::OsString {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut name = std::ffi::OsString::from(".");
    name.push(final_name);
    name.push(format!(".{}-{nanos}-{n}.tmp", std::process::id()));
    name
}

/// Creates a new file, failing if anything (a symlink included: `O_EXCL` does not follow one)
/// is at `path`; readable and writable by the owner only.
fn create_new(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// Removes a cached cubin that the driver refused (stale or damaged), so the next load compiles.
fn evict(path: &Path) {
    let _ = std::fs::remove_file(path);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use std::cell::Cell;
    use std::ffi::OsString;
    #[cfg(unix)]
    use std::os::unix::fs::{symlink, PermissionsExt};

    /// A fresh directory under the system's temporary directory, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(label: &str) -> Self {
            static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let dir = std::env::temp_dir().join(format!(
                "wgpu-flash-attn-disk-cache-{label}-{}-{n}-{nanos}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn entry() -> Entry {
        Entry {
            file_name: "flash_fwd_test-sm_90a-0123456789abcdef.cubin".into(),
            key: 0x0123_4567_89ab_cdef,
        }
    }

    /// A stand-in for NVRTC: returns `cubin` and counts its calls.
    fn compiler<'a>(cubin: &'a [u8], calls: &'a Cell<u32>) -> impl FnOnce() -> Result<(Vec<u8>, String)> + 'a {
        move || {
            calls.set(calls.get() + 1);
            Ok((cubin.to_vec(), "ptxas info: Used 1 registers".into()))
        }
    }

    /// A stand-in for the driver: loads anything that starts with `CUBIN:` except `refused`
    /// (a cubin it cannot load, or one without the entry point).
    fn loader(refused: &[u8]) -> impl FnMut(&[u8]) -> Result<Vec<u8>> + '_ {
        move |bytes| {
            if bytes.starts_with(b"CUBIN:") && bytes != refused {
                Ok(bytes.to_vec())
            } else {
                Err(Error::Unavailable {
                    what: "the test module".into(),
                    why: format!("the fake driver refuses {:?}", String::from_utf8_lossy(bytes)),
                })
            }
        }
    }

    /// Stores `cubin` for [`entry`] in `dir` the way a first process does.
    fn first_use(dir: &Path, cubin: &[u8]) -> Fetched<Vec<u8>> {
        let calls = Cell::new(0);
        let f = fetch(Some(dir), &entry(), compiler(cubin, &calls), loader(b"")).unwrap();
        assert_eq!(calls.get(), 1);
        assert!(matches!(f.cache, CacheStatus::Stored { .. }), "{:?}", f.cache);
        f
    }

    /// A later process: compiles `fresh` if it must; the loader refuses `refused`.
    fn later_use(dir: &Path, fresh: &[u8], refused: &[u8]) -> (Fetched<Vec<u8>>, u32) {
        let calls = Cell::new(0);
        let f = fetch(Some(dir), &entry(), compiler(fresh, &calls), loader(refused)).unwrap();
        (f, calls.get())
    }

    #[test]
    fn a_second_use_reads_the_file_the_first_stored() {
        let dir = TempDir::new("hit");
        let first = first_use(&dir.0, b"CUBIN:good");
        assert!(matches!(first.origin, Origin::Compiled { .. }));
        assert_eq!(first.value, b"CUBIN:good");
        let (again, compiles) = later_use(&dir.0, b"CUBIN:other", b"");
        assert_eq!((compiles, again.origin), (0, Origin::DiskCache));
        assert_eq!(again.value, b"CUBIN:good");
        assert_eq!(again.cache, CacheStatus::Hit(dir.0.join(entry().file_name)));
        let (off, compiles) = {
            let calls = Cell::new(0);
            let f = fetch(None, &entry(), compiler(b"CUBIN:good", &calls), loader(b"")).unwrap();
            (f, calls.get())
        };
        assert_eq!((compiles, off.cache), (1, CacheStatus::Off));
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[cfg(unix)]
    #[test]
    fn stored_files_are_private() {
        let dir = TempDir::new("file-mode");
        first_use(&dir.0, b"CUBIN:good");
        assert_eq!(mode(&dir.0.join(entry().file_name)), 0o600);
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_at_a_temporary_name_is_not_followed() {
        let dir = TempDir::new("tmp-symlink");
        let victim = TempDir::new("tmp-symlink-victim");
        let target = victim.0.join("victim");
        std::fs::write(&target, b"precious").unwrap();
        let path = dir.0.join(entry().file_name);
        // Every name a writer has used or could guess from the PID.
        let pid = std::process::id();
        for name in [
            path.with_extension(format!("tmp{pid}")),
            dir.0.join(format!(".{}.{pid}.tmp", entry().file_name)),
        ] {
            symlink(&target, name).unwrap();
        }
        first_use(&dir.0, b"CUBIN:good");
        assert_eq!(std::fs::read(&target).unwrap(), b"precious", "the target was written");
        let (again, compiles) = later_use(&dir.0, b"CUBIN:other", b"");
        assert_eq!((compiles, again.value.as_slice()), (0, &b"CUBIN:good"[..]));
    }

    #[cfg(unix)]
    #[test]
    fn exclusive_creation_refuses_a_planted_symlink() {
        let dir = TempDir::new("create-new");
        let target = dir.0.join("target");
        std::fs::write(&target, b"precious").unwrap();
        let link = dir.0.join("link");
        symlink(&target, &link).unwrap();
        let err = create_new(&link).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        let names: std::collections::HashSet<_> = (0..100).map(|_| temp_name("f".as_ref())).collect();
        assert_eq!(names.len(), 100, "every temporary name is new");
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
}
