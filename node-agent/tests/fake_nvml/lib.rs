//! A fake `libnvidia-ml.so.1`: the NVML entry points `nvml-wrapper` calls
//! for what the node agent's `SystemNvml` uses, answered from a script, so
//! the agent's real NVML path runs end to end without a GPU.
//!
//! Built by `tests/nvml_library.rs` at run time (`rustc --crate-type
//! cdylib`, no dependencies) and found by the agent through
//! `LD_LIBRARY_PATH`. Written from `nvml.h`'s declarations (as
//! `nvml-wrapper-sys`'s `bindings.rs` gives them); no code of NVML or of
//! `nvml-wrapper`.
//!
//! The script, named by `FAKE_NVML_SCRIPT`, one setting a line (`#`
//! starts a comment):
//!
//! ```text
//! gpus 2                       # first: how many GPUs
//! log /tmp/x/nvml.log          # every call, one line each (optional)
//! control /tmp/x/control       # lines applied while it runs (optional)
//! state /tmp/x/state           # what the GPUs keep across processes (optional)
//! * limit_mw 500000            # GPU index or * for all, a key, its value
//! 1 unsupported nvmlDeviceGetPowerUsage
//! 1 unsupported_field 94
//! 0 field 82 61                # field id 82 answers 61
//! * fail nvmlDeviceRegisterEvents 999   # answers NVML_ERROR_UNKNOWN
//! ```
//!
//! Keys: `name`, `uuid`, the numbers of [`NUMBERS`] (`persistence` 1 on,
//! 0 off), `ecc on|off`, `field
//! ID VALUE`, `unsupported CALL` (that entry point answers
//! `NVML_ERROR_NOT_SUPPORTED` on that GPU), `fail CALL CODE` (it answers
//! the `nvmlReturn_t` CODE on that GPU; 0 makes it answer again) and
//! `unsupported_field ID`. A field not given answers 0.
//!
//! The control file, appended to while the agent runs, takes the same
//! per-GPU lines (`0 limit_mw 450000` is an administrator's `nvidia-smi -i
//! 0 -pl 450`), `xid GPU CODE`, queued on every event set its GPU is
//! registered on (as NVML's, each set's queue is its own, gone when the
//! set is freed; one that no set holds goes to the first set that
//! registers its GPU), which the set's wait delivers, and
//! `wait_fails CODE`: the next wait of an event set answers the
//! `nvmlReturn_t` CODE (a driver hiccup that ends the agent's XID watch;
//! what is queued on the set stays);
//! the fake reads what was added when the file grew, at most every 20 ms. The
//! log gets one whole line per call, `NAME GPU [VALUE]` (`-` for no GPU;
//! VALUE the mW of a limit set, the process id of `nvmlInit_v2`), and
//! `control LINE` per control line applied. The state file keeps each
//! GPU's limit and how far the control file was read, so a GPU keeps its
//! limit over the agent's restart, as a real one does.
//!
//! Glossary:
//! - *handle*: `nvmlDevice_t`; here `index + 1` cast to a pointer.
//! - *event set*: `nvmlEventSet_t`; here a number from 1, with the GPUs
//!   registered on it.

// NVML's entry points keep NVML's names; the safety of each is nvml.h's
// contract (its pointers valid for what they point to), said once here.
#![allow(non_snake_case, clippy::missing_safety_doc)]

mod types {
    include!("types.rs");
}

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::raw::{c_char, c_int, c_uint, c_ulonglong};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use types::*;

/// The driver version the fake reports (a version whose field ids
/// `nvml-wrapper` passes through unchanged).
const DRIVER_VERSION: &str = "550.54.15";
const _: () = assert!(DRIVER_VERSION.len() < SYSTEM_DRIVER_VERSION_BUFFER_SIZE as usize);
/// The longest the control file goes unread.
const CONTROL_EVERY: Duration = Duration::from_millis(20);
/// How often the event set's wait looks for a queued XID (with a control
/// file).
const WAIT_POLL: Duration = Duration::from_millis(50);

/// Every numeric key of a GPU, with its value until the script sets it.
const NUMBERS: [(&str, u64); 16] = [
    ("limit_mw", 700_000),
    ("default_mw", 700_000),
    ("min_mw", 200_000),
    ("max_mw", 700_000),
    ("temp_c", 40),
    ("power_mw", 100_000),
    ("energy_mj", 0),
    ("sm_mhz", 1_980),
    ("mem_mhz", 2_619),
    ("util_pct", 0),
    ("throttle_bits", 0),
    ("ecc_sbe_volatile", 0),
    ("ecc_dbe_volatile", 0),
    ("ecc_sbe_aggregate", 0),
    ("ecc_dbe_aggregate", 0),
    ("persistence", 1),
];

/// The ECC counters' keys, indexed by NVML's counter type (volatile 0,
/// aggregate 1) and error type (corrected 0, uncorrected 1).
const ECC_KEYS: [[&str; 2]; 2] = [
    ["ecc_sbe_volatile", "ecc_dbe_volatile"],
    ["ecc_sbe_aggregate", "ecc_dbe_aggregate"],
];

/// One fake GPU.
struct Gpu {
    name: String,
    uuid: String,
    ecc_on: bool,
    /// The values of [`NUMBERS`]'s keys.
    numbers: BTreeMap<&'static str, u64>,
    fields: BTreeMap<u32, u64>,
    unsupported: BTreeSet<String>,
    /// Entry points that fail on this GPU, with NVML's answer.
    failing: BTreeMap<String, Return>,
    unsupported_fields: BTreeSet<u32>,
}

impl Gpu {
    fn new(index: usize) -> Self {
        Self {
            name: "NVIDIA H200".into(),
            uuid: format!("GPU-fa4e0000-0000-0000-0000-{index:012}"),
            ecc_on: true,
            numbers: NUMBERS.into_iter().collect(),
            fields: BTreeMap::new(),
            unsupported: BTreeSet::new(),
            failing: BTreeMap::new(),
            unsupported_fields: BTreeSet::new(),
        }
    }

    /// The value of numeric key `key`.
    fn get(&self, key: &str) -> u64 {
        self.numbers.get(key).copied().unwrap_or(0)
    }

    /// [`Gpu::get`] for a C `unsigned int` (the script's values of those
    /// keys fit: checked when set).
    fn get32(&self, key: &str) -> c_uint {
        self.get(key).min(u64::from(c_uint::MAX)) as c_uint
    }

    /// Sets `key` to `args`.
    fn set(&mut self, key: &str, args: &[&str]) -> Result<(), String> {
        let one = || match args {
            [v] => Ok(*v),
            _ => Err(format!("{key} takes one value, not {args:?}")),
        };
        let num = |w: &str| w.parse::<u64>().map_err(|e| format!("{key} {w}: {e}"));
        if let Some((k, _)) = NUMBERS.iter().find(|(k, _)| *k == key) {
            let v = num(one()?)?;
            // Only the energy, the clock-event bits and the ECC counts are
            // 64-bit in nvml.h.
            let wide = *k == "energy_mj" || *k == "throttle_bits" || k.starts_with("ecc_");
            if !wide && v > u64::from(c_uint::MAX) {
                return Err(format!("{key} {v} does not fit NVML's unsigned int"));
            }
            self.numbers.insert(k, v);
            return Ok(());
        }
        match (key, args) {
            ("name", _) => self.name = fits(args.join(" "), DEVICE_NAME_V2_BUFFER_SIZE)?,
            ("uuid", _) => self.uuid = fits(one()?.into(), DEVICE_UUID_V2_BUFFER_SIZE)?,
            ("ecc", _) => self.ecc_on = one()? == "on",
            ("unsupported", _) => drop(self.unsupported.insert(one()?.into())),
            ("unsupported_field", _) => drop(self.unsupported_fields.insert(num(one()?)? as u32)),
            ("field", [id, v]) => drop(self.fields.insert(num(id)? as u32, num(v)?)),
            ("fail", [call, code]) => {
                let code = num(code)? as Return;
                if code == SUCCESS {
                    self.failing.remove(*call);
                } else {
                    self.failing.insert(call.to_string(), code);
                }
            }
            _ => return Err(format!("unknown key {key:?} (or its values {args:?})")),
        }
        Ok(())
    }
}

/// `s`, if it fits a buffer of `size` bytes with its NUL, as NVML's
/// names do.
fn fits(s: String, size: c_uint) -> Result<String, String> {
    let room = size as usize - 1;
    (s.len() <= room)
        .then_some(s)
        .ok_or(format!("longer than NVML's {room} bytes"))
}

/// The control file and how far it was read.
struct Control {
    path: PathBuf,
    /// Bytes applied.
    offset: u64,
    /// When it was last looked at.
    checked: Option<Instant>,
}

/// The fake driver: its GPUs and what it was told.
#[derive(Default)]
struct Fake {
    gpus: Vec<Gpu>,
    log: Option<File>,
    control: Option<Control>,
    state: Option<PathBuf>,
    /// XIDs of GPUs no event set holds yet, given to the first set that
    /// registers their GPU: GPU index and code.
    xids: VecDeque<(usize, u64)>,
    /// What the next event set's wait answers instead (`wait_fails`).
    wait_fails: Option<Return>,
    /// Each event set: its registered GPUs, one bit each, and the XIDs
    /// queued on it (as NVML's, each set's own: freed, they are gone).
    sets: BTreeMap<usize, (u64, VecDeque<(usize, u64)>)>,
    next_set: usize,
    /// `nvmlInit_v2` calls not yet shut down.
    inits: u32,
}

static FAKE: Mutex<Option<Fake>> = Mutex::new(None);

fn lock() -> MutexGuard<'static, Option<Fake>> {
    FAKE.lock().unwrap_or_else(|e| e.into_inner())
}

impl Fake {
    /// The fake the script at `path` describes.
    fn load(path: &str) -> Result<Fake, String> {
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        let mut fake = Fake::default();
        for (n, line) in text.lines().enumerate() {
            fake.script_line(line)
                .map_err(|e| format!("line {}: {e}", n + 1))?;
        }
        fake.restore()?;
        Ok(fake)
    }

    /// One line of the script.
    fn script_line(&mut self, line: &str) -> Result<(), String> {
        let line = line.split('#').next().unwrap_or("");
        let words: Vec<&str> = line.split_whitespace().collect();
        let path = |w: &[&str]| match w {
            [p] => Ok(PathBuf::from(p)),
            _ => Err(format!("one path, not {w:?}")),
        };
        match words.as_slice() {
            [] => {}
            ["gpus", n] => {
                let n: usize = n.parse().map_err(|e| format!("gpus {n}: {e}"))?;
                self.gpus = (0..n).map(Gpu::new).collect();
            }
            ["log", rest @ ..] => {
                let p = path(rest)?;
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&p)
                    .map_err(|e| format!("log {}: {e}", p.display()))?;
                self.log = Some(file);
            }
            ["control", rest @ ..] => {
                self.control = Some(Control {
                    path: path(rest)?,
                    offset: 0,
                    checked: None,
                });
            }
            ["state", rest @ ..] => self.state = Some(path(rest)?),
            _ => self.gpu_line(&words)?,
        }
        Ok(())
    }

    /// `GPU KEY VALUE…` (GPU an index or `*`), `xid GPU CODE` or
    /// `wait_fails CODE`.
    fn gpu_line(&mut self, words: &[&str]) -> Result<(), String> {
        if let ["xid", gpu, code] = words {
            let gpu = self.gpu_index(gpu)?;
            let code = code.parse().map_err(|e| format!("xid {code}: {e}"))?;
            let mut held = false;
            for (mask, queue) in self.sets.values_mut() {
                if *mask & (1 << gpu) != 0 {
                    queue.push_back((gpu, code));
                    held = true;
                }
            }
            if !held {
                self.xids.push_back((gpu, code));
            }
            return Ok(());
        }
        if let ["wait_fails", code] = words {
            let code = code
                .parse()
                .map_err(|e| format!("wait_fails {code}: {e}"))?;
            self.wait_fails = Some(code);
            return Ok(());
        }
        let [which, key, args @ ..] = words else {
            return Err(format!("expected GPU KEY VALUE, found {words:?}"));
        };
        let gpus: Vec<usize> = if *which == "*" {
            (0..self.gpus.len()).collect()
        } else {
            vec![self.gpu_index(which)?]
        };
        for i in gpus {
            self.gpus[i].set(key, args)?;
        }
        Ok(())
    }

    /// GPU `word`'s index, if there is one.
    fn gpu_index(&self, word: &str) -> Result<usize, String> {
        match word.parse::<usize>() {
            Ok(i) if i < self.gpus.len() => Ok(i),
            _ => Err(format!(
                "no GPU {word:?} of {} (`gpus N` first)",
                self.gpus.len()
            )),
        }
    }

    /// Takes the limits and the control file's offset from the state file,
    /// where one was written.
    fn restore(&mut self) -> Result<(), String> {
        let Some(path) = &self.state else {
            return Ok(());
        };
        let Ok(text) = std::fs::read_to_string(path) else {
            return Ok(());
        };
        let path = path.display().to_string();
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let done = match words.as_slice() {
                ["offset", n] => n.parse().map_err(|e| format!("{e}")).map(|n| {
                    if let Some(c) = &mut self.control {
                        c.offset = n;
                    }
                }),
                _ => self.gpu_line(&words),
            };
            done.map_err(|e| format!("state {path}: {line:?}: {e}"))?;
        }
        Ok(())
    }

    /// Writes the state file (a new file renamed over the old one).
    fn save(&self) {
        let Some(path) = &self.state else {
            return;
        };
        let mut text = format!("offset {}\n", self.control.as_ref().map_or(0, |c| c.offset));
        for (i, g) in self.gpus.iter().enumerate() {
            text.push_str(&format!("{i} limit_mw {}\n", g.get("limit_mw")));
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            eprintln!("fake NVML: state {}: {e}", path.display());
        }
    }

    /// Appends `NAME GPU EXTRA` to the log.
    fn note(&mut self, name: &str, gpu: &str, extra: &str) {
        if let Some(log) = &mut self.log {
            let _ = log.write_all(format!("{name} {gpu}{extra}\n").as_bytes());
        }
    }

    /// Applies what was added to the control file, unless it was looked at
    /// less than [`CONTROL_EVERY`] ago or has not changed.
    fn poll_control(&mut self) {
        let Some(c) = &mut self.control else {
            return;
        };
        if c.checked.is_some_and(|t| t.elapsed() < CONTROL_EVERY) {
            return;
        }
        c.checked = Some(Instant::now());
        let Ok(meta) = std::fs::metadata(&c.path) else {
            return;
        };
        // Appended to only: what is past the offset is new.
        if meta.len() <= c.offset {
            return;
        }
        let mut added = String::new();
        let read = File::open(&c.path).and_then(|mut f| {
            f.seek(SeekFrom::Start(c.offset))?;
            f.read_to_string(&mut added)
        });
        if read.is_err() {
            return;
        }
        // Whole lines only: one being written is read next time.
        let whole = added.rfind('\n').map_or(0, |i| i + 1);
        c.offset += whole as u64;
        for line in added[..whole].lines() {
            self.note("control", line, "");
            let words: Vec<&str> = line.split_whitespace().collect();
            if !words.is_empty() {
                if let Err(e) = self.gpu_line(&words) {
                    eprintln!("fake NVML: control line {line:?}: {e}");
                }
            }
        }
        self.save();
    }

    /// The GPU index of `device`, if it is one of the fake's handles.
    fn index(&self, device: Device) -> Option<usize> {
        let v = device as usize;
        (1..=self.gpus.len()).contains(&v).then(|| v - 1)
    }
}

/// GPU `index`'s handle.
fn handle(index: usize) -> Device {
    (index + 1) as Device
}

/// Runs `name` on the fake, counted in the log with `gpu` and `extra`.
fn on_fake(name: &str, gpu: &str, extra: &str, f: impl FnOnce(&mut Fake) -> Return) -> Return {
    let mut guard = lock();
    let Some(fake) = guard.as_mut() else {
        return ERROR_UNINITIALIZED;
    };
    fake.poll_control();
    fake.note(name, gpu, extra);
    f(fake)
}

/// Runs `name` on the GPU of `device`: counted in the log (with `extra`),
/// "not supported" where the script says so.
fn on_gpu_with(
    name: &str,
    device: Device,
    extra: &str,
    f: impl FnOnce(&mut Fake, usize) -> Return,
) -> Return {
    let mut guard = lock();
    let Some(fake) = guard.as_mut() else {
        return ERROR_UNINITIALIZED;
    };
    fake.poll_control();
    let Some(i) = fake.index(device) else {
        fake.note(name, "-", extra);
        return ERROR_INVALID_ARGUMENT;
    };
    fake.note(name, &i.to_string(), extra);
    if fake.gpus[i].unsupported.contains(name) {
        return ERROR_NOT_SUPPORTED;
    }
    if let Some(&code) = fake.gpus[i].failing.get(name) {
        return code;
    }
    f(fake, i)
}

/// [`on_gpu_with`] for a call that reads the GPU.
fn on_gpu(name: &str, device: Device, f: impl FnOnce(&Gpu) -> Return) -> Return {
    on_gpu_with(name, device, "", |fake, i| f(&fake.gpus[i]))
}

/// Writes `v` to `out`.
fn put<T>(out: *mut T, v: T) -> Return {
    if out.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: NVML's caller passes a valid pointer for its answer.
    unsafe { out.write(v) };
    SUCCESS
}

/// Writes `s` and its NUL to `buf` of `len` bytes.
fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Return {
    if buf.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    if s.len() + 1 > len as usize {
        return ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's buffer holds `len` bytes, checked above.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        buf.add(s.len()).write(0);
    }
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Return {
    let mut guard = lock();
    if guard.is_none() {
        let path = std::env::var("FAKE_NVML_SCRIPT").unwrap_or_default();
        match Fake::load(&path) {
            Ok(fake) => *guard = Some(fake),
            Err(e) => {
                eprintln!("fake NVML: FAKE_NVML_SCRIPT={path:?}: {e}");
                return ERROR_DRIVER_NOT_LOADED;
            }
        }
    }
    let Some(fake) = guard.as_mut() else {
        return ERROR_UNKNOWN;
    };
    fake.inits += 1;
    fake.note("nvmlInit_v2", "-", &format!(" {}", std::process::id()));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Return {
    let mut guard = lock();
    let Some(fake) = guard.as_mut() else {
        return ERROR_UNINITIALIZED;
    };
    fake.note("nvmlShutdown", "-", "");
    fake.inits -= 1;
    if fake.inits == 0 {
        *guard = None;
    }
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> Return {
    on_fake("nvmlSystemGetDriverVersion", "-", "", |_| {
        put_str(version, length, DRIVER_VERSION)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Return {
    on_fake("nvmlDeviceGetCount_v2", "-", "", |fake| {
        put(count, fake.gpus.len() as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut Device,
) -> Return {
    let name = "nvmlDeviceGetHandleByIndex_v2";
    on_fake(name, &index.to_string(), "", |fake| {
        match fake.gpus.get(index as usize) {
            Some(g) if g.unsupported.contains(name) => ERROR_NOT_SUPPORTED,
            Some(g) if g.failing.contains_key(name) => g.failing[name],
            Some(_) => put(device, handle(index as usize)),
            None => ERROR_INVALID_ARGUMENT,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: Device, index: *mut c_uint) -> Return {
    on_gpu_with("nvmlDeviceGetIndex", device, "", |_, i| {
        put(index, i as c_uint)
    })
}

/// Entry points that give one value of a GPU: `NAME(device, out)`.
macro_rules! readings {
    ($($name:ident: $t:ty = |$g:ident| $v:expr;)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(device: Device, out: *mut $t) -> Return {
            on_gpu(stringify!($name), device, |$g| put(out, $v))
        }
    )*};
}

readings! {
    nvmlDeviceGetPowerManagementDefaultLimit: c_uint = |g| g.get32("default_mw");
    nvmlDeviceGetPowerManagementLimit: c_uint = |g| g.get32("limit_mw");
    nvmlDeviceGetEnforcedPowerLimit: c_uint = |g| g.get32("limit_mw");
    nvmlDeviceGetPowerUsage: c_uint = |g| g.get32("power_mw");
    nvmlDeviceGetTotalEnergyConsumption: c_ulonglong = |g| g.get("energy_mj");
    nvmlDeviceGetCurrentClocksThrottleReasons: c_ulonglong = |g| g.get("throttle_bits");
    nvmlDeviceGetSupportedEventTypes: c_ulonglong = |_g| EVENT_TYPE_XID_CRITICAL_ERROR;
    nvmlDeviceGetPersistenceMode: c_uint = |g| g.get32("persistence");
    nvmlDeviceGetUtilizationRates: Utilization = |g| Utilization {
        gpu: g.get32("util_pct"),
        memory: g.get32("util_pct") / 2,
    };
}

/// Entry points that give a GPU's string: `NAME(device, buffer, length)`.
macro_rules! strings {
    ($($name:ident = |$g:ident| $v:expr;)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(device: Device, buf: *mut c_char, length: c_uint) -> Return {
            on_gpu(stringify!($name), device, |$g| put_str(buf, length, $v))
        }
    )*};
}

strings! {
    nvmlDeviceGetName = |g| &g.name;
    nvmlDeviceGetUUID = |g| &g.uuid;
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    device: Device,
    min: *mut c_uint,
    max: *mut c_uint,
) -> Return {
    on_gpu(
        "nvmlDeviceGetPowerManagementLimitConstraints",
        device,
        |g| match put(min, g.get32("min_mw")) {
            SUCCESS => put(max, g.get32("max_mw")),
            e => e,
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetPowerManagementLimit(
    device: Device,
    limit: c_uint,
) -> Return {
    let extra = format!(" {limit}");
    on_gpu_with(
        "nvmlDeviceSetPowerManagementLimit",
        device,
        &extra,
        |fake, i| {
            let g = &mut fake.gpus[i];
            if !(g.get32("min_mw")..=g.get32("max_mw")).contains(&limit) {
                return ERROR_INVALID_ARGUMENT;
            }
            g.numbers.insert("limit_mw", limit.into());
            fake.save();
            SUCCESS
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: Device,
    sensor: c_uint,
    temp: *mut c_uint,
) -> Return {
    on_gpu("nvmlDeviceGetTemperature", device, |g| match sensor {
        TEMPERATURE_GPU => put(temp, g.get32("temp_c")),
        _ => ERROR_INVALID_ARGUMENT,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: Device,
    kind: c_uint,
    clock: *mut c_uint,
) -> Return {
    on_gpu("nvmlDeviceGetClockInfo", device, |g| match kind {
        CLOCK_GRAPHICS | CLOCK_SM => put(clock, g.get32("sm_mhz")),
        CLOCK_MEM => put(clock, g.get32("mem_mhz")),
        _ => ERROR_INVALID_ARGUMENT,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: Device,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Return {
    on_gpu("nvmlDeviceGetEccMode", device, |g| {
        let mode = if g.ecc_on {
            FEATURE_ENABLED
        } else {
            FEATURE_DISABLED
        };
        match put(current, mode) {
            SUCCESS => put(pending, mode),
            e => e,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: Device,
    error_type: c_uint,
    counter_type: c_uint,
    count: *mut c_ulonglong,
) -> Return {
    on_gpu("nvmlDeviceGetTotalEccErrors", device, |g| {
        let known = [VOLATILE_ECC, AGGREGATE_ECC].contains(&counter_type)
            && [MEMORY_ERROR_TYPE_CORRECTED, MEMORY_ERROR_TYPE_UNCORRECTED].contains(&error_type);
        if !known {
            return ERROR_INVALID_ARGUMENT;
        }
        if !g.ecc_on {
            return ERROR_NOT_SUPPORTED;
        }
        put(
            count,
            g.get(ECC_KEYS[counter_type as usize][error_type as usize]),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: Device,
    count: c_int,
    values: *mut FieldValue,
) -> Return {
    on_gpu("nvmlDeviceGetFieldValues", device, |g| {
        if count <= 0 || values.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: the caller passes `count` values to fill in.
        let values = unsafe { std::slice::from_raw_parts_mut(values, count as usize) };
        let now_us = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        for v in values {
            let supported = !g.unsupported_fields.contains(&v.field_id);
            v.timestamp = now_us;
            v.latency_usec = 0;
            v.value_type = VALUE_TYPE_UNSIGNED_LONG_LONG;
            v.nvml_return = if supported {
                SUCCESS
            } else {
                ERROR_NOT_SUPPORTED
            };
            v.value = Value {
                ull_val: g.fields.get(&v.field_id).copied().unwrap_or(0),
            };
        }
        SUCCESS
    })
}

mod events;
