//! A NOR flash backed by a file, for Linux hosts: the same rules as a real
//! part (see [`crate::nor`]), the geometry of the board, and `fdatasync`
//! after every write and erase, so what returned is on disk.
//!
//! Fault injection, for benchmarks and tests: with the environment
//! variable [`SYNC_DELAY_ENV`] (`LOOPWARDEN_FAULT_FLASH_SYNC_MS`) set to a
//! number of milliseconds when the file is opened, every sync takes that
//! much longer, as on a slow or busy disk. It is read once, at
//! [`FileFlash::open`]; [`FileFlash::sync_delay`] says what was set.
//!
//! A file that is missing or 0 bytes long is made erased at opening, and
//! [`FileFlash::created`] says so: what it holds is nothing an earlier run
//! kept (a replaced disk, a state folder not mounted, a path changed).
//! A path that is not a regular file (a block or character device, which
//! reads 0 bytes long too) is refused before anything is written to it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use embedded_storage_async::nor_flash::{ErrorType, MultiwriteNorFlash, NorFlash, ReadNorFlash};

use crate::nor::{FlashError, FlashStats, IoOp, NorImage};

/// The geometry of a flash part, as a board definition states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlashGeometry {
    /// Smallest programmable unit, bytes.
    pub write_size: u32,
    /// Erase unit (sector), bytes.
    pub erase_size: u32,
    /// Program page: the most one program operation writes, bytes.
    pub program_page: u32,
    /// Number of sectors.
    pub sectors: u32,
}

impl FlashGeometry {
    /// Bytes in all.
    pub fn capacity(&self) -> u64 {
        self.erase_size as u64 * self.sectors as u64
    }
}

/// Why a flash file was refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum FileFlashError {
    /// The file could not be opened, created or read.
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The board's geometry is not the one this build's flash type has.
    Geometry {
        /// The file.
        path: PathBuf,
        /// What differs.
        detail: std::string::String,
    },
    /// Another process has the file open as a flash: two writers would
    /// tear each other's records.
    InUse {
        /// The file.
        path: PathBuf,
    },
    /// The path names something other than a regular file (a block or
    /// character device, a folder, a pipe): refused before any write,
    /// since it reads 0 bytes long, as a new file does, and would be
    /// wiped as new.
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The file's size is not the board's capacity: refused, not reformatted.
    WrongSize {
        /// The file.
        path: PathBuf,
        /// Its size.
        found: u64,
        /// The capacity the board states.
        expected: u64,
    },
}

impl core::fmt::Display for FileFlashError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FileFlashError::Io { path, source } => {
                write!(f, "flash file {}: {source}", path.display())
            }
            FileFlashError::Geometry { path, detail } => {
                write!(f, "flash file {}: {detail}", path.display())
            }
            FileFlashError::InUse { path } => write!(
                f,
                "flash file {} is in use by another process (an agent or controller \
                 already running on it? `systemctl status`): two writers would tear its records",
                path.display()
            ),
            FileFlashError::NotAFile { path, kind } => write!(
                f,
                "flash file {} is not a regular file ({kind}): refused, nothing written to it; \
                 `flash` must name a file (made if missing), e.g. /var/lib/loopwarden/node-agent.flash",
                path.display()
            ),
            FileFlashError::WrongSize {
                path,
                found,
                expected,
            } => write!(
                f,
                "flash file {} is {found} bytes but the board's flash is {expected} bytes; \
                 refusing to reformat it (move it away to start empty)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for FileFlashError {}

/// The environment variable that slows every sync of a flash file by its
/// value in milliseconds (fault injection for benchmarks and tests).
pub const SYNC_DELAY_ENV: &str = "LOOPWARDEN_FAULT_FLASH_SYNC_MS";

/// The extra delay per sync that a value of [`SYNC_DELAY_ENV`] sets, if
/// any: `None` when it is unset, zero or not a number of milliseconds.
fn sync_delay_of(value: Option<&str>) -> Option<Duration> {
    value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
}

/// Locks `file` (at `path`) for this process alone: a POSIX write lock
/// over the whole file (`fcntl` `F_SETLK`), held while the process keeps
/// the file open and released when it exits, a crash included. Another
/// process that holds it is refused at once. Within one process the lock
/// is the process's own: an agent restarted in the same process (a test,
/// the hall) opens its file again whatever handles of its former run
/// linger; nothing else in an agent opens its flash file.
fn lock(file: &File, path: &Path) -> Result<(), FileFlashError> {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed `flock` is a valid value of the plain C struct.
    let mut whole: libc::flock = unsafe { std::mem::zeroed() };
    whole.l_type = libc::F_WRLCK as libc::c_short;
    whole.l_whence = libc::SEEK_SET as libc::c_short;
    // l_start 0, l_len 0: the whole file, however long it grows.
    // SAFETY: `fcntl` reads the descriptor, which `file` keeps open, and
    // the struct, which lives for the call.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &whole) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Err(FileFlashError::InUse {
            path: path.to_path_buf(),
        }),
        _ => Err(FileFlashError::Io {
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

/// Refuses `meta` (of `path`) unless it is a regular file: a device
/// reads 0 bytes long and would be wiped as a new file.
fn regular(meta: &std::fs::Metadata, path: &Path) -> Result<(), FileFlashError> {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    let kind = match () {
        _ if t.is_file() => return Ok(()),
        _ if t.is_block_device() => "a block device",
        _ if t.is_char_device() => "a character device",
        _ if t.is_dir() => "a folder",
        _ if t.is_fifo() => "a pipe",
        _ if t.is_socket() => "a socket",
        _ => "not a file",
    };
    Err(FileFlashError::NotAFile {
        path: path.to_path_buf(),
        kind,
    })
}

/// A file-backed NOR flash with sectors of `ERASE` bytes written in words of
/// `WRITE` bytes.
#[derive(Debug)]
pub struct FileFlash<const WRITE: usize, const ERASE: usize> {
    file: File,
    image: NorImage,
    program_page: usize,
    /// Injected extra time per sync ([`SYNC_DELAY_ENV`]).
    sync_delay: Option<Duration>,
    /// The file was made erased at this opening.
    created: bool,
    /// A failed write whose bytes could not be read back, or a failed
    /// sync ([`FileFlash::broken`]).
    broken: Option<FlashError>,
    /// Every sync fails with EIO (tests).
    #[cfg(test)]
    sync_fails: bool,
}

impl<const WRITE: usize, const ERASE: usize> FileFlash<WRITE, ERASE> {
    /// Opens `path` as a flash of `geometry`, creating it erased (all
    /// `0xFF`) if it does not exist, is 0 bytes long, or is shorter and
    /// erased only (a first fill cut short by a full disk or a power cut)
    /// ([`FileFlash::created`]). A file of another size, a path that is
    /// not a regular file (a device: it reads 0 bytes long), or a
    /// geometry this type cannot be, is refused with the reason, unwritten.
    pub fn open(path: &Path, geometry: &FlashGeometry) -> Result<Self, FileFlashError> {
        let io = |source| FileFlashError::Io {
            path: path.to_path_buf(),
            source,
        };
        if geometry.write_size as usize != WRITE || geometry.erase_size as usize != ERASE {
            return Err(FileFlashError::Geometry {
                path: path.to_path_buf(),
                detail: std::format!(
                    "the board states write size {} and erase size {}, this flash type has {WRITE} and {ERASE}",
                    geometry.write_size, geometry.erase_size
                ),
            });
        }
        if geometry.sectors == 0
            || geometry.program_page == 0
            || geometry.program_page as usize % WRITE != 0
            || ERASE % geometry.program_page as usize != 0
        {
            return Err(FileFlashError::Geometry {
                path: path.to_path_buf(),
                detail: std::format!(
                    "program page {} must divide the erase size {ERASE} and be a multiple of the write size {WRITE}, with at least one sector",
                    geometry.program_page
                ),
            });
        }
        let expected = geometry.capacity();
        // Before opening it for writing (a device's open may act), and
        // again on what was opened.
        match std::fs::metadata(path) {
            Ok(meta) => regular(&meta, path)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        regular(&meta, path)?;
        lock(&file, path)?;
        let found = meta.len();
        // New, or a pre-fill that stopped short (the disk full, power
        // lost): nothing but erased bytes, the rest filled now.
        let new = found == 0 || (found < expected && erased_only(&file, found).map_err(io)?);
        if new {
            let erased = std::vec![0xFF; ERASE];
            for s in 0..geometry.sectors as u64 {
                file.write_all_at(&erased, s * ERASE as u64).map_err(io)?;
            }
            file.sync_all().map_err(io)?;
        } else if found != expected {
            return Err(FileFlashError::WrongSize {
                path: path.to_path_buf(),
                found,
                expected,
            });
        }
        let mut bytes = std::vec![0u8; expected as usize];
        file.read_exact_at(&mut bytes, 0).map_err(io)?;
        Ok(Self {
            file,
            image: NorImage::new(bytes, WRITE, ERASE),
            program_page: geometry.program_page as usize,
            sync_delay: sync_delay_of(std::env::var(SYNC_DELAY_ENV).ok().as_deref()),
            created: new,
            broken: None,
            #[cfg(test)]
            sync_fails: false,
        })
    }

    /// The file was made erased at this opening (it was missing or 0
    /// bytes long): it holds nothing an earlier run kept.
    pub fn created(&self) -> bool {
        self.created
    }

    /// The extra time every sync takes, injected by [`SYNC_DELAY_ENV`]
    /// when the file was opened; `None` for a flash as fast as its disk.
    pub fn sync_delay(&self) -> Option<Duration> {
        self.sync_delay
    }

    /// What the flash has done since it was opened.
    pub fn stats(&self) -> FlashStats {
        self.image.stats.clone()
    }

    /// Writes `len` bytes of the image at `offset` to the file and syncs
    /// them. Where the file refuses, the image is put back to what the
    /// file holds, so memory is never ahead of the disk, and the error
    /// names the operation, the address and the system's cause. Where
    /// even that read fails, memory and file may differ: every later
    /// operation fails with the same error ([`FileFlash::broken`]). So
    /// after a failed sync: what reads back then is the system's cache,
    /// which may hold bytes the disk does not (the system forgets a failed
    /// sync, and the next one of the same pages succeeds), so a restart
    /// could find less than memory holds; only a reopening, which reads
    /// the disk, is believed again.
    fn persist(&mut self, offset: usize, len: usize) -> Result<(), FlashError> {
        let result = self.write_through(offset, len);
        if let Err(e) = result {
            let range = offset..offset + len;
            let sync = matches!(e, FlashError::Io { op: IoOp::Sync, .. });
            if sync
                || self
                    .file
                    .read_exact_at(&mut self.image.bytes[range], offset as u64)
                    .is_err()
            {
                self.broken = Some(e);
            }
        }
        result
    }

    /// The error that left memory and the file apart, if one did: every
    /// operation since has failed with it.
    pub fn broken(&self) -> Option<FlashError> {
        self.broken
    }

    fn usable(&self) -> Result<(), FlashError> {
        self.broken.map_or(Ok(()), Err)
    }

    /// Program operations a real part would need for `len` bytes at `offset`
    /// (writes split at program-page boundaries), then the sync.
    fn write_through(&self, offset: usize, len: usize) -> Result<(), FlashError> {
        let failed = |op, at: usize| {
            move |e: io::Error| FlashError::Io {
                op,
                at: at as u32,
                os_error: e.raw_os_error(),
            }
        };
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let page_end = (at / self.program_page + 1) * self.program_page;
            let chunk = page_end.min(end) - at;
            self.file
                .write_all_at(&self.image.bytes[at..at + chunk], at as u64)
                .map_err(failed(IoOp::Write, at))?;
            at += chunk;
        }
        #[cfg(test)]
        if self.sync_fails {
            return Err(failed(IoOp::Sync, offset)(io::Error::from_raw_os_error(5)));
        }
        self.file.sync_data().map_err(failed(IoOp::Sync, offset))?;
        if let Some(d) = self.sync_delay {
            std::thread::sleep(d);
        }
        Ok(())
    }
}

/// Whether the first `len` bytes of `file` are all erased (`0xFF`).
fn erased_only(file: &File, len: u64) -> io::Result<bool> {
    let mut buf = std::vec![0u8; 64 * 1024];
    let mut at = 0;
    while at < len {
        let n = buf.len().min((len - at) as usize);
        file.read_exact_at(&mut buf[..n], at)?;
        if buf[..n].iter().any(|&b| b != 0xFF) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

impl<const WRITE: usize, const ERASE: usize> ErrorType for FileFlash<WRITE, ERASE> {
    type Error = FlashError;
}

impl<const WRITE: usize, const ERASE: usize> ReadNorFlash for FileFlash<WRITE, ERASE> {
    const READ_SIZE: usize = 1;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), FlashError> {
        self.usable()?;
        self.image.read(offset, bytes)
    }

    fn capacity(&self) -> usize {
        self.image.bytes.len()
    }
}

impl<const WRITE: usize, const ERASE: usize> NorFlash for FileFlash<WRITE, ERASE> {
    const WRITE_SIZE: usize = WRITE;
    const ERASE_SIZE: usize = ERASE;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), FlashError> {
        self.usable()?;
        let r = self.image.erase(from, to)?;
        self.persist(r.start, r.len())
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), FlashError> {
        self.usable()?;
        let start = offset as usize;
        let before = self.image.bytes[start..start + bytes.len()].to_vec();
        let n = self.image.write(offset, bytes)?;
        let result = self.persist(start, n);
        if result.is_err() && self.broken.is_none() {
            // Memory went back to what the file holds: a word it holds as
            // before was not written (the pages before a failed one were).
            for (i, word) in before[..n].chunks(WRITE).enumerate() {
                let at = start + i * WRITE;
                if self.image.bytes[at..at + word.len()] == *word {
                    self.image.unwrite(at as u32, word.len());
                }
            }
        }
        result
    }
}

impl<const WRITE: usize, const ERASE: usize> MultiwriteNorFlash for FileFlash<WRITE, ERASE> {}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;

    const GEO: FlashGeometry = FlashGeometry {
        write_size: 4,
        erase_size: 4096,
        program_page: 256,
        sectors: 4,
    };

    #[test]
    fn a_write_the_file_refuses_says_why_and_leaves_memory_as_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flash.bin");
        block_on(async {
            let mut f = FileFlash::<4, 4096>::open(&path, &GEO).unwrap();
            f.write(0, &[1, 2, 3, 4]).await.unwrap();
            // The same file, opened for reading only: writes fail (EBADF).
            f.file = File::open(&path).unwrap();
            let err = f.write(4100, &[5, 6, 7, 8]).await.unwrap_err();
            assert!(
                matches!(
                    err,
                    FlashError::Io {
                        op: IoOp::Write,
                        at: 4100,
                        os_error: Some(_)
                    }
                ),
                "{err:?}"
            );
            let words = err.to_string();
            assert!(
                words.contains("writing at 0x1004") && words.contains("os error"),
                "{words}"
            );
            let mut b = [0; 4];
            f.read(4100, &mut b).await.unwrap();
            assert_eq!(b, [0xFF; 4], "memory went back to what the file holds");
            assert_eq!(f.broken(), None);
            f.read(0, &mut b).await.unwrap();
            assert_eq!(b, [1, 2, 3, 4]);
            // A refused write does not count against the word's writes
            // since its erase: two more still go in once the file takes
            // them.
            f.file = File::options().read(true).write(true).open(&path).unwrap();
            f.write(4100, &[0xF0; 4]).await.unwrap();
            f.write(4100, &[0; 4]).await.unwrap();
            f.read(4100, &mut b).await.unwrap();
            assert_eq!(b, [0; 4]);
        });
    }

    #[test]
    fn a_write_whose_bytes_cannot_be_read_back_fails_every_later_operation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flash.bin");
        block_on(async {
            let mut f = FileFlash::<4, 4096>::open(&path, &GEO).unwrap();
            // A folder: neither written nor read as a file.
            f.file = File::open(dir.path()).unwrap();
            let err = f.write(0, &[1, 2, 3, 4]).await.unwrap_err();
            assert_eq!(f.broken(), Some(err));
            let mut b = [0; 4];
            assert_eq!(f.read(0, &mut b).await, Err(err));
            assert_eq!(f.erase(0, 4096).await, Err(err));
        });
    }

    /// A failed sync (EIO from a failing card): the page cache may hold
    /// what the disk does not, so nothing after it is believed until the
    /// file is opened again.
    #[test]
    fn a_failed_sync_fails_every_later_operation_until_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flash.bin");
        block_on(async {
            let mut f = FileFlash::<4, 4096>::open(&path, &GEO).unwrap();
            f.write(0, &[1, 2, 3, 4]).await.unwrap();
            f.sync_fails = true;
            let err = f.write(8, &[5, 6, 7, 8]).await.unwrap_err();
            assert!(
                matches!(
                    err,
                    FlashError::Io {
                        op: IoOp::Sync,
                        at: 8,
                        os_error: Some(5)
                    }
                ),
                "{err:?}"
            );
            assert_eq!(f.broken(), Some(err));
            f.sync_fails = false;
            assert_eq!(f.write(16, &[9; 4]).await, Err(err), "nothing after it");
            let mut b = [0; 4];
            assert_eq!(f.read(0, &mut b).await, Err(err));
        });
        let mut again = FileFlash::<4, 4096>::open(&path, &GEO).unwrap();
        let mut b = [0; 4];
        block_on(again.read(0, &mut b)).unwrap();
        assert_eq!(b, [1, 2, 3, 4], "what was synced");
    }

    #[test]
    fn creates_erased_and_keeps_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flash.bin");
        block_on(async {
            let mut f = FileFlash::<4, 4096>::open(&path, &GEO).unwrap();
            f.write(4096, &[1, 2, 3, 4]).await.unwrap();
            assert_eq!(
                f.write(4096, &[0xFF; 4]).await,
                Err(FlashError::BitSet { at: 4096 })
            );
        });
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 * 4096);
        block_on(async {
            let mut f = FileFlash::<4, 4096>::open(&path, &GEO).unwrap();
            let mut b = [0; 8];
            f.read(4096, &mut b).await.unwrap();
            assert_eq!(b, [1, 2, 3, 4, 0xFF, 0xFF, 0xFF, 0xFF]);
        });
    }

    #[test]
    fn a_file_another_process_holds_is_refused_and_this_one_may_reopen_its_own() {
        use std::io::{BufRead, BufReader};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flash.bin");
        let mine = FileFlash::<4, 4096>::open(&path, &GEO).unwrap();
        // This process again (an agent restarted in it): its own lock.
        FileFlash::<4, 4096>::open(&path, &GEO).expect("this process's own file");
        drop(mine);
        // Another process holding a POSIX lock on it (Python's lockf).
        let Ok(mut other) = std::process::Command::new("python3")
            .args([
                "-c",
                "import fcntl,sys,time; f=open(sys.argv[1],'r+'); \
                 fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('held', flush=True); \
                 time.sleep(60)",
            ])
            .arg(&path)
            .stdout(std::process::Stdio::piped())
            .spawn()
        else {
            eprintln!("SKIP: no python3 to hold the file from another process");
            return;
        };
        let mut line = String::new();
        BufReader::new(other.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "held");
        let e = FileFlash::<4, 4096>::open(&path, &GEO).unwrap_err();
        other.kill().unwrap();
        other.wait().unwrap();
        assert!(
            matches!(&e, FileFlashError::InUse { path: p } if *p == path),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "flash file {} is in use by another process (an agent or controller already running on it? `systemctl status`): two writers would tear its records",
                path.display()
            )
        );
        FileFlash::<4, 4096>::open(&path, &GEO).expect("free once the other exited");
    }

    #[test]
    fn says_whether_the_file_was_made_blank_at_this_opening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flash.bin");
        let f = FileFlash::<4, 4096>::open(&path, &GEO).unwrap();
        assert!(f.created(), "a missing file is made blank");
        drop(f);
        let f = FileFlash::<4, 4096>::open(&path, &GEO).unwrap();
        assert!(!f.created(), "an existing file, even all erased, is not");
        drop(f);
        std::fs::write(&path, []).unwrap();
        let f = FileFlash::<4, 4096>::open(&path, &GEO).unwrap();
        assert!(f.created(), "a file of 0 bytes is made blank");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 * 4096);
    }

    #[test]
    fn refuses_wrong_size_and_geometry_without_touching_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flash.bin");
        std::fs::write(&path, [0u8; 1000]).unwrap();
        let e = FileFlash::<4, 4096>::open(&path, &GEO)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is 1000 bytes but the board's flash is 16384 bytes"),
            "{e}"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            [0u8; 1000],
            "not reformatted"
        );
        let other = FlashGeometry {
            write_size: 8,
            ..GEO
        };
        let e = FileFlash::<4, 4096>::open(&path, &other)
            .unwrap_err()
            .to_string();
        assert!(e.contains("write size 8"), "{e}");
    }

    /// A first fill cut short (the disk full, power lost): the erased
    /// bytes it left are a new file, filled now, not a wrong size for ever.
    /// A device named as the flash (`/dev/mtdblock0`, a typo for a disk)
    /// reads 0 bytes long, as a new file does: refused before any write,
    /// never wiped as new at every start.
    #[test]
    fn a_path_that_is_not_a_regular_file_is_refused_unwritten() {
        let err = FileFlash::<4, 4096>::open(Path::new("/dev/null"), &GEO).unwrap_err();
        assert!(matches!(err, FileFlashError::NotAFile { .. }), "{err:?}");
        let said = err.to_string();
        assert!(
            said.contains("/dev/null") && said.contains("not a regular file"),
            "{said}"
        );
        let dir = tempfile::tempdir().unwrap();
        let err = FileFlash::<4, 4096>::open(dir.path(), &GEO).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn a_first_fill_cut_short_is_filled_at_the_next_opening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flash.bin");
        std::fs::write(&path, [0xFFu8; 3 * 4096 + 100]).unwrap();
        let f = FileFlash::<4, 4096>::open(&path, &GEO).expect("filled");
        assert!(f.created());
        drop(f);
        assert_eq!(std::fs::read(&path).unwrap(), [0xFFu8; 4 * 4096]);
    }

    #[test]
    fn an_injected_sync_delay_slows_every_write_and_erase() {
        assert_eq!(sync_delay_of(None), None);
        assert_eq!(sync_delay_of(Some("0")), None);
        assert_eq!(sync_delay_of(Some("fast")), None);
        assert_eq!(sync_delay_of(Some(" 50")), Some(Duration::from_millis(50)));
        let dir = tempfile::tempdir().unwrap();
        let mut f = FileFlash::<4, 4096>::open(&dir.path().join("flash.bin"), &GEO).unwrap();
        f.sync_delay = Some(Duration::from_millis(20));
        let t = std::time::Instant::now();
        block_on(async {
            f.write(0, &[1, 2, 3, 4]).await.unwrap();
            f.erase(0, 4096).await.unwrap();
        });
        assert!(
            t.elapsed() >= Duration::from_millis(40),
            "two syncs, 20 ms each"
        );
    }
}
