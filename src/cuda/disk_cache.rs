//! The disk half of the kernel cache: where cubins live between processes, how a file is read
//! back and written. Compiling and loading are closures, so nothing here needs cudarc or a GPU
//! and every path through it is tested on temporary directories.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::sha256::sha256;
use crate::error::Result;

/// Where compiled kernels are kept between processes.
///
/// The directory is created owner-only (0700). It must be an absolute path and, on Unix, owned by
/// this process's user and not writable by group or others; otherwise the cache is not used
/// (kernels compile in every process) and the engine's `KernelInfo::disk_cache` says why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DiskCache {
    /// `$WGPU_FLASH_ATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/wgpu-flash-attn/cuda` (an absolute
    /// `XDG_CACHE_HOME` only, as the XDG spec says), else `$HOME/.cache/wgpu-flash-attn/cuda`;
    /// none if no variable is set.
    #[default]
    Default,
    /// This directory (an absolute path; created on the first store).
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
    if let Some(d) = non_empty("XDG_CACHE_HOME").filter(|d| d.is_absolute()) {
        return Some(d.join("wgpu-flash-attn").join("cuda"));
    }
    non_empty("HOME").map(|h| h.join(".cache").join("wgpu-flash-attn").join("cuda"))
}

/// Where a kernel's binary came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Origin {
    /// NVRTC compiled it in this process, taking this long.
    Compiled {
        /// Wall-clock time of the NVRTC compile, in milliseconds.
        millis: f64,
    },
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
    Stored {
        /// The cache file written.
        path: PathBuf,
        /// Why a file already at `path` was not used (`None`: there was none).
        replaced: Option<String>,
    },
    /// Compiled and kept in memory only: why the cache could not be used or written.
    Bypassed {
        /// Why the cache was not used (directory not absolute, not owned by this user, writable
        /// by others, an I/O error).
        why: String,
    },
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

/// The kernel of `entry`: `load` applied to the cubin cached in `dir`, or, when there is none
/// that can be trusted and loaded, to a fresh `compile`, which then replaces the file.
///
/// A cached file is used only if its header names `entry.key` and the SHA-256 of its cubin
/// matches (a truncated, damaged or foreign file is a miss), and only if `load` accepts it (a
/// driver that refuses the cubin, or a module without the entry point, is a miss too). A miss
/// compiles in memory and tries to replace the file; when that fails the kernel is still
/// returned, with [`CacheStatus::Bypassed`] saying why. Only a failing compile, or `load`
/// refusing a fresh cubin, is an error: the cache is an optimization.
pub fn fetch<T>(
    dir: Option<&Path>,
    entry: &Entry,
    compile: impl FnOnce() -> Result<(Vec<u8>, String)>,
    mut load: impl FnMut(&[u8]) -> Result<T>,
) -> Result<Fetched<T>> {
    let Some(dir) = dir else {
        let (fresh, _) = compile_and_load(compile, &mut load)?;
        return Ok(fresh.with(CacheStatus::Off));
    };
    if let Err(why) = private_dir(dir) {
        let (fresh, _) = compile_and_load(compile, &mut load)?;
        return Ok(fresh.with(CacheStatus::Bypassed {
            why: format!("cache directory {} refused: {why}", dir.display()),
        }));
    }
    let path = dir.join(&entry.file_name);
    let rejected = match read_verified(&path, entry.key) {
        Ok(None) => None,
        Ok(Some(cubin)) => match load(&cubin) {
            Ok(value) => {
                return Ok(Fetched {
                    value,
                    log: String::new(),
                    origin: Origin::DiskCache,
                    cache: CacheStatus::Hit(path),
                })
            }
            Err(e) => Some(format!("the driver refused it: {e}")),
        },
        Err(why) => Some(why),
    };
    let (fresh, cubin) = compile_and_load(compile, &mut load)?;
    let stored = write_atomically(&path, &encode(entry.key, &cubin));
    let cache = match (stored, rejected) {
        (Ok(()), replaced) => CacheStatus::Stored { path, replaced },
        (Err(e), None) => CacheStatus::Bypassed {
            why: format!("could not write {}: {e}", path.display()),
        },
        (Err(e), Some(why)) => CacheStatus::Bypassed {
            why: format!("{} was not used ({why}) and could not be replaced: {e}", path.display()),
        },
    };
    Ok(fresh.with(cache))
}

/// Creates `dir` (and missing parents) owner-only, and checks that only this user can write it:
/// whoever can write the cache directory chooses the code this process loads onto the GPU.
///
/// Refused, with the reason: a relative path (it would depend on the working directory; name an
/// absolute one), and on Unix a directory owned by another user or writable by group or others
/// (`chmod 700` it, or choose another). A symlink to a directory is followed and its target
/// checked. Elsewhere (Windows) ownership and ACLs are not checked.
fn private_dir(dir: &Path) -> std::result::Result<(), String> {
    if dir.is_relative() {
        return Err("a relative path; name an absolute one".into());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|e| e.to_string())?;
    let meta = std::fs::metadata(dir).map_err(|e| e.to_string())?;
    if !meta.is_dir() {
        return Err("not a directory".into());
    }
    private_to_us(&meta)
}

/// Whether only this user can have written what `meta` describes (a cache file or directory).
#[cfg(unix)]
fn private_to_us(meta: &std::fs::Metadata) -> std::result::Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    extern "C" {
        fn geteuid() -> u32;
    }
    // SAFETY: geteuid takes nothing, cannot fail and only reads the process's credentials.
    let euid = unsafe { geteuid() };
    if meta.uid() != euid {
        return Err(format!("owned by uid {}, not this process's {euid}", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "writable by group or others (mode {:o}); chmod go-w it",
            meta.mode() & 0o777
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn private_to_us(_: &std::fs::Metadata) -> std::result::Result<(), String> {
    Ok(())
}

/// A fresh compile's result before the cache has had its say.
struct Fresh<T> {
    value: T,
    log: String,
    millis: f64,
}

impl<T> Fresh<T> {
    fn with(self, cache: CacheStatus) -> Fetched<T> {
        Fetched {
            value: self.value,
            log: self.log,
            origin: Origin::Compiled { millis: self.millis },
            cache,
        }
    }
}

fn compile_and_load<T>(
    compile: impl FnOnce() -> Result<(Vec<u8>, String)>,
    load: &mut impl FnMut(&[u8]) -> Result<T>,
) -> Result<(Fresh<T>, Vec<u8>)> {
    let start = Instant::now();
    let (cubin, log) = compile()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let value = load(&cubin)?;
    Ok((Fresh { value, log, millis }, cubin))
}

/// The first bytes of every cache file; the last one is the format's version.
const MAGIC: [u8; 16] = *b"wgpu-flash-attn\x02";
/// Magic, key (u64 LE), cubin length (u64 LE), SHA-256 of the cubin.
const HEADER_BYTES: usize = 16 + 8 + 8 + 32;

/// A cache file's bytes: the header, then the cubin.
///
/// The digest catches truncation, damage and files from elsewhere. It cannot stop someone who
/// can write the directory (they can write a matching digest): that is what the directory's
/// ownership and permission checks are for.
fn encode(key: u64, cubin: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_BYTES + cubin.len());
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&key.to_le_bytes());
    bytes.extend_from_slice(&(cubin.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&sha256(cubin));
    bytes.extend_from_slice(cubin);
    bytes
}

/// The cubin in a cache file's bytes, or why they are not one for `key`.
fn decode(key: u64, bytes: &[u8]) -> std::result::Result<&[u8], String> {
    if bytes.len() < HEADER_BYTES || bytes[..16] != MAGIC {
        return Err("not a cache file of this version".into());
    }
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(b)
    };
    if u64_at(16) != key {
        return Err(format!("stored for key {:016x}", u64_at(16)));
    }
    let cubin = &bytes[HEADER_BYTES..];
    if u64_at(24) != cubin.len() as u64 {
        return Err(format!(
            "{} bytes of cubin, the header says {}",
            cubin.len(),
            u64_at(24)
        ));
    }
    if sha256(cubin)[..] != bytes[32..64] {
        return Err("the cubin's SHA-256 does not match the header's".into());
    }
    Ok(cubin)
}

/// The cubin cached at `path` for `key`: `None` when there is no file, an error saying why a
/// file there cannot be used (it is then replaced).
fn read_verified(path: &Path, key: u64) -> std::result::Result<Option<Vec<u8>>, String> {
    use std::io::Read;
    let link = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    // Not followed: only the regular file this cache wrote is trusted.
    if !link.file_type().is_file() {
        return Err("not a regular file".into());
    }
    let mut file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    // What was opened, not what the name pointed to a moment before.
    let meta = file.metadata().map_err(|e| e.to_string())?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if (meta.dev(), meta.ino()) != (link.dev(), link.ino()) {
            return Err("replaced while being opened".into());
        }
    }
    private_to_us(&meta)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    decode(key, &bytes).map(|cubin| Some(cubin.to_vec()))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use std::cell::Cell;
    use std::ffi::OsString;
    #[cfg(unix)]
    use std::os::unix::fs::{chown, symlink, PermissionsExt};

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

    #[test]
    fn a_planted_file_with_the_right_name_is_not_loaded() {
        let dir = TempDir::new("planted");
        first_use(&dir.0, b"CUBIN:good");
        let path = dir.0.join(entry().file_name);
        // Right name, content the driver would happily load, but not what this cache wrote.
        std::fs::write(&path, b"CUBIN:evil").unwrap();
        let (f, compiles) = later_use(&dir.0, b"CUBIN:good", b"");
        assert_eq!(f.value, b"CUBIN:good", "the planted cubin was loaded");
        assert_eq!(compiles, 1);
        assert!(
            matches!(&f.cache, CacheStatus::Stored { replaced: Some(_), .. }),
            "{:?}",
            f.cache
        );
        let (again, compiles) = later_use(&dir.0, b"CUBIN:other", b"");
        assert_eq!((compiles, again.value.as_slice()), (0, &b"CUBIN:good"[..]), "replaced");
    }

    #[test]
    fn a_truncated_file_is_recompiled_and_replaced() {
        let dir = TempDir::new("truncated");
        first_use(&dir.0, b"CUBIN:good and long");
        let path = dir.0.join(entry().file_name);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        let (f, compiles) = later_use(&dir.0, b"CUBIN:good and long", b"");
        assert_eq!((compiles, f.value.as_slice()), (1, &b"CUBIN:good and long"[..]));
        assert!(
            matches!(&f.cache, CacheStatus::Stored { replaced: Some(_), .. }),
            "{:?}",
            f.cache
        );
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "the whole file again");
    }

    #[test]
    fn relative_directories_are_refused() {
        let relative = PathBuf::from(format!("wgpu-flash-attn-relative-cache-{}", std::process::id()));
        let calls = Cell::new(0);
        let f = fetch(Some(&relative), &entry(), compiler(b"CUBIN:good", &calls), loader(b"")).unwrap();
        let created = relative.exists();
        let _ = std::fs::remove_dir_all(&relative);
        assert!(
            !created,
            "a cache directory was created relative to the working directory"
        );
        assert_eq!(f.value, b"CUBIN:good");
        match &f.cache {
            CacheStatus::Bypassed { why } => assert!(why.contains("relative"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[cfg(unix)]
    #[test]
    fn the_cache_directory_is_created_private() {
        let base = TempDir::new("created");
        let dir = base.0.join("a").join("cuda");
        first_use(&dir, b"CUBIN:good");
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&base.0.join("a")), 0o700);
    }

    #[cfg(unix)]
    #[test]
    fn a_directory_others_may_write_is_refused() {
        for (label, perms) in [("group", 0o770), ("world", 0o707)] {
            let dir = TempDir::new(label);
            first_use(&dir.0, b"CUBIN:good");
            std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(perms)).unwrap();
            let (f, compiles) = later_use(&dir.0, b"CUBIN:fresh", b"");
            assert_eq!((compiles, f.value.as_slice()), (1, &b"CUBIN:fresh"[..]), "{label}");
            match &f.cache {
                CacheStatus::Bypassed { why } => assert!(why.contains("writable"), "{why}"),
                other => panic!("{label}: {other:?}"),
            }
        }
    }

    /// Gives `path` to `nobody`; false (and a printed reason) where this process may not.
    #[cfg(unix)]
    fn give_away(path: &Path) -> bool {
        match chown(path, Some(65534), Some(65534)) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("skipping: cannot chown {} to 65534 ({e}); run as root", path.display());
                false
            }
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_directory_of_another_user_is_refused() {
        let dir = TempDir::new("other-owner-dir");
        first_use(&dir.0, b"CUBIN:good");
        if !give_away(&dir.0) {
            return;
        }
        let (f, compiles) = later_use(&dir.0, b"CUBIN:fresh", b"");
        assert_eq!((compiles, f.value.as_slice()), (1, &b"CUBIN:fresh"[..]));
        match &f.cache {
            CacheStatus::Bypassed { why } => assert!(why.contains("owned by uid 65534"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_file_of_another_user_or_writable_by_others_is_not_loaded() {
        let dir = TempDir::new("other-owner-file");
        let path = dir.0.join(entry().file_name);
        first_use(&dir.0, b"CUBIN:good");
        if !give_away(&path) {
            return;
        }
        let (f, compiles) = later_use(&dir.0, b"CUBIN:fresh", b"");
        assert_eq!((compiles, f.value.as_slice()), (1, &b"CUBIN:fresh"[..]));
        assert!(
            matches!(&f.cache, CacheStatus::Stored { replaced: Some(why), .. } if why.contains("owned by uid 65534")),
            "{:?}",
            f.cache
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let (f, compiles) = later_use(&dir.0, b"CUBIN:fresher", b"");
        assert_eq!((compiles, f.value.as_slice()), (1, &b"CUBIN:fresher"[..]));
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
    fn a_symlink_at_the_final_name_is_replaced_not_followed() {
        let dir = TempDir::new("final-symlink");
        let victim = TempDir::new("final-symlink-victim");
        let target = victim.0.join("victim.cubin");
        std::fs::write(&target, b"CUBIN:victim").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o700)).unwrap();
        let path = dir.0.join(entry().file_name);
        symlink(&target, &path).unwrap();
        let (f, compiles) = later_use(&dir.0, b"CUBIN:good", b"");
        assert_eq!(
            (compiles, f.value.as_slice()),
            (1, &b"CUBIN:good"[..]),
            "followed the link"
        );
        assert_eq!(
            std::fs::read(&target).unwrap(),
            b"CUBIN:victim",
            "the target was written"
        );
        assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_file());
        let (again, compiles) = later_use(&dir.0, b"CUBIN:other", b"");
        assert_eq!((compiles, again.value.as_slice()), (0, &b"CUBIN:good"[..]));
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

    /// Makes `dir` unwritable for this process: `chmod 500`, or for root (whom modes do not stop)
    /// the immutable attribute; `None` (and a printed reason) where neither works.
    #[cfg(unix)]
    fn freeze(dir: &Path) -> Option<Frozen> {
        let writable = || {
            let probe = dir.join("probe");
            let ok = std::fs::write(&probe, b"").is_ok();
            let _ = std::fs::remove_file(&probe);
            ok
        };
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o500)).ok()?;
        if !writable() {
            return Some(Frozen(dir.to_path_buf(), false));
        }
        let chattr = |flag: &str| std::process::Command::new("chattr").arg(flag).arg(dir).status();
        if chattr("+i").is_ok_and(|s| s.success()) && !writable() {
            return Some(Frozen(dir.to_path_buf(), true));
        }
        let _ = chattr("-i");
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        eprintln!("skipping: cannot make {} unwritable", dir.display());
        None
    }

    #[cfg(unix)]
    struct Frozen(PathBuf, bool);

    #[cfg(unix)]
    impl Drop for Frozen {
        fn drop(&mut self) {
            if self.1 {
                let _ = std::process::Command::new("chattr").arg("-i").arg(&self.0).status();
            }
            let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o700));
        }
    }

    #[test]
    fn a_cached_cubin_the_loader_refuses_is_replaced() {
        let dir = TempDir::new("refused");
        // Verifies, but the driver cannot use it (another toolkit's, or no entry point).
        first_use(&dir.0, b"CUBIN:stale");
        let (f, compiles) = later_use(&dir.0, b"CUBIN:good", b"CUBIN:stale");
        assert_eq!((compiles, f.value.as_slice()), (1, &b"CUBIN:good"[..]));
        match &f.cache {
            CacheStatus::Stored {
                replaced: Some(why), ..
            } => assert!(why.contains("fake driver"), "{why}"),
            other => panic!("{other:?}"),
        }
        let (again, compiles) = later_use(&dir.0, b"CUBIN:other", b"CUBIN:stale");
        assert_eq!((compiles, again.value.as_slice()), (0, &b"CUBIN:good"[..]));
    }

    #[cfg(unix)]
    #[test]
    fn a_refused_cubin_that_cannot_be_replaced_still_yields_the_kernel() {
        let dir = TempDir::new("frozen");
        first_use(&dir.0, b"CUBIN:stale");
        let Some(_frozen) = freeze(&dir.0) else { return };
        for _ in 0..2 {
            let (f, compiles) = later_use(&dir.0, b"CUBIN:good", b"CUBIN:stale");
            assert_eq!((compiles, f.value.as_slice()), (1, &b"CUBIN:good"[..]));
            match &f.cache {
                CacheStatus::Bypassed { why } => assert!(why.contains("fake driver"), "{why}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn files_carry_their_key_length_and_digest() {
        let bytes = encode(7, b"CUBIN:x");
        assert_eq!(decode(7, &bytes), Ok(&b"CUBIN:x"[..]));
        assert!(decode(8, &bytes).unwrap_err().contains("key"));
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(decode(7, &flipped).unwrap_err().contains("SHA-256"));
        assert!(decode(7, &bytes[..bytes.len() - 1])
            .unwrap_err()
            .contains("header says"));
        assert!(decode(7, b"CUBIN:x").is_err());
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
        assert_eq!(
            default_cache_dir(env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "relative")])),
            Some(PathBuf::from("/h/.cache/wgpu-flash-attn/cuda")),
            "the XDG spec ignores relative paths"
        );
        assert_eq!(DiskCache::Off.dir(), None);
        assert_eq!(DiskCache::Dir("/d".into()).dir(), Some(PathBuf::from("/d")));
    }
}
