// The C types and constants of `nvml.h` that the fake NVML's entry points
// take and give, declared as `nvml.h` has them. `include!`d by the fake
// (`lib.rs`) and by `tests/nvml_library.rs`, which checks each struct's
// size, alignment and field offsets, and each constant, against
// `nvml-wrapper-sys`'s own declarations. (Plain comments: an included file
// takes no inner doc comment.)

use std::os::raw::{c_int, c_longlong, c_uint, c_ulong, c_ulonglong, c_ushort};

/// `nvmlReturn_t`.
pub type Return = c_uint;

/// `nvmlDevice_st`: opaque; the fake's handles are `index + 1`.
#[repr(C)]
pub struct DeviceSt {
    _opaque: [u8; 0],
}

/// `nvmlDevice_t`.
pub type Device = *mut DeviceSt;

/// `nvmlEventSet_st`: opaque; the fake's sets are numbered from 1.
#[repr(C)]
pub struct EventSetSt {
    _opaque: [u8; 0],
}

/// `nvmlEventSet_t`.
pub type EventSet = *mut EventSetSt;

/// `nvmlValue_t`: one sample's value, typed by its `valueType`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union Value {
    /// `dVal`.
    pub d_val: f64,
    /// `siVal`.
    pub si_val: c_int,
    /// `uiVal`.
    pub ui_val: c_uint,
    /// `ulVal`.
    pub ul_val: c_ulong,
    /// `ullVal`.
    pub ull_val: c_ulonglong,
    /// `sllVal`.
    pub sll_val: c_longlong,
    /// `usVal`.
    pub us_val: c_ushort,
}

/// `nvmlFieldValue_t`: one field of `nvmlDeviceGetFieldValues`, asked by
/// `field_id`, answered in the rest.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FieldValue {
    /// `fieldId`.
    pub field_id: c_uint,
    /// `scopeId`.
    pub scope_id: c_uint,
    /// `timestamp`, µs since the epoch.
    pub timestamp: c_longlong,
    /// `latencyUsec`.
    pub latency_usec: c_longlong,
    /// `valueType` (`nvmlValueType_t`).
    pub value_type: c_uint,
    /// `nvmlReturn`: this field's own answer.
    pub nvml_return: Return,
    /// `value`.
    pub value: Value,
}

/// `nvmlUtilization_t`, %.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Utilization {
    /// `gpu`.
    pub gpu: c_uint,
    /// `memory`.
    pub memory: c_uint,
}

/// `nvmlEventData_t`: what `nvmlEventSetWait_v2` delivers.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventData {
    /// `device`.
    pub device: Device,
    /// `eventType`.
    pub event_type: c_ulonglong,
    /// `eventData`: the XID, for an XID event.
    pub event_data: c_ulonglong,
    /// `gpuInstanceId`.
    pub gpu_instance_id: c_uint,
    /// `computeInstanceId`.
    pub compute_instance_id: c_uint,
}

/// `NVML_SUCCESS`.
pub const SUCCESS: Return = 0;
/// `NVML_ERROR_UNINITIALIZED`.
pub const ERROR_UNINITIALIZED: Return = 1;
/// `NVML_ERROR_INVALID_ARGUMENT`.
pub const ERROR_INVALID_ARGUMENT: Return = 2;
/// `NVML_ERROR_NOT_SUPPORTED`.
pub const ERROR_NOT_SUPPORTED: Return = 3;
/// `NVML_ERROR_INSUFFICIENT_SIZE`.
pub const ERROR_INSUFFICIENT_SIZE: Return = 7;
/// `NVML_ERROR_DRIVER_NOT_LOADED`.
pub const ERROR_DRIVER_NOT_LOADED: Return = 9;
/// `NVML_ERROR_TIMEOUT`.
pub const ERROR_TIMEOUT: Return = 10;
/// `NVML_ERROR_UNKNOWN`.
pub const ERROR_UNKNOWN: Return = 999;

/// `NVML_VALUE_TYPE_UNSIGNED_LONG_LONG`.
pub const VALUE_TYPE_UNSIGNED_LONG_LONG: c_uint = 3;
/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_TYPE_XID_CRITICAL_ERROR: c_ulonglong = 8;
/// `NVML_FEATURE_DISABLED`.
pub const FEATURE_DISABLED: c_uint = 0;
/// `NVML_FEATURE_ENABLED`.
pub const FEATURE_ENABLED: c_uint = 1;
/// `NVML_TEMPERATURE_GPU`.
pub const TEMPERATURE_GPU: c_uint = 0;
/// `NVML_CLOCK_GRAPHICS`.
pub const CLOCK_GRAPHICS: c_uint = 0;
/// `NVML_CLOCK_SM`.
pub const CLOCK_SM: c_uint = 1;
/// `NVML_CLOCK_MEM`.
pub const CLOCK_MEM: c_uint = 2;
/// `NVML_MEMORY_ERROR_TYPE_CORRECTED`.
pub const MEMORY_ERROR_TYPE_CORRECTED: c_uint = 0;
/// `NVML_MEMORY_ERROR_TYPE_UNCORRECTED`.
pub const MEMORY_ERROR_TYPE_UNCORRECTED: c_uint = 1;
/// `NVML_VOLATILE_ECC`.
pub const VOLATILE_ECC: c_uint = 0;
/// `NVML_AGGREGATE_ECC`.
pub const AGGREGATE_ECC: c_uint = 1;
/// `NVML_DEVICE_NAME_V2_BUFFER_SIZE`.
pub const DEVICE_NAME_V2_BUFFER_SIZE: c_uint = 96;
/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
pub const DEVICE_UUID_V2_BUFFER_SIZE: c_uint = 96;
/// `NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE`.
pub const SYSTEM_DRIVER_VERSION_BUFFER_SIZE: c_uint = 80;
