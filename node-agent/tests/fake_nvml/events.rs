//! The fake's XID event sets: created, GPUs registered on them, waited
//! on and freed, each set with a queue of its own as in NVML.

use super::*;

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut EventSet) -> Return {
    on_fake("nvmlEventSetCreate", "-", "", |fake| {
        fake.next_set += 1;
        let id = fake.next_set;
        fake.sets.insert(id, (0, VecDeque::new()));
        put(set, id as EventSet)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: Device,
    types: c_ulonglong,
    set: EventSet,
) -> Return {
    on_gpu_with("nvmlDeviceRegisterEvents", device, "", |fake, i| {
        if types & !EVENT_TYPE_XID_CRITICAL_ERROR != 0 {
            return ERROR_NOT_SUPPORTED;
        }
        match fake.sets.get_mut(&(set as usize)) {
            Some((mask, queue)) => {
                *mask |= 1 << i;
                // The XIDs of this GPU that no set held are this one's.
                let (mine, rest): (VecDeque<_>, VecDeque<_>) =
                    fake.xids.drain(..).partition(|(gpu, _)| *gpu == i);
                fake.xids = rest;
                queue.extend(mine);
                SUCCESS
            }
            None => ERROR_INVALID_ARGUMENT,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: EventSet) -> Return {
    on_fake("nvmlEventSetFree", "-", "", |fake| {
        match fake.sets.remove(&(set as usize)) {
            Some(_) => SUCCESS,
            None => ERROR_INVALID_ARGUMENT,
        }
    })
}

/// The next queued XID of a GPU registered on set `id`, taken off the
/// queue, and whether more can come (there is a control file); `Err` when
/// there is no such set, or the wait was told to fail (`wait_fails`). The
/// wait is logged when `first`.
fn next_xid(id: usize, first: bool) -> Result<(Option<(usize, u64)>, bool), Return> {
    let mut guard = lock();
    let Some(fake) = guard.as_mut() else {
        return Err(ERROR_UNINITIALIZED);
    };
    fake.poll_control();
    if first {
        fake.note("nvmlEventSetWait_v2", "-", "");
    }
    let more = fake.control.is_some();
    let Some((_, queue)) = fake.sets.get_mut(&id) else {
        return Err(ERROR_INVALID_ARGUMENT);
    };
    // A failed wait leaves what is queued on the set.
    if let Some(code) = fake.wait_fails.take() {
        return Err(code);
    }
    Ok((queue.pop_front(), more))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: EventSet,
    data: *mut EventData,
    timeout_ms: c_uint,
) -> Return {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms.into());
    let mut first = true;
    loop {
        let (next, more) = match next_xid(set as usize, std::mem::take(&mut first)) {
            Ok(v) => v,
            Err(e) => return e,
        };
        if let Some((gpu, xid)) = next {
            let event = EventData {
                device: handle(gpu),
                event_type: EVENT_TYPE_XID_CRITICAL_ERROR,
                event_data: xid,
                gpu_instance_id: u32::MAX,
                compute_instance_id: u32::MAX,
            };
            return put(data, event);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return ERROR_TIMEOUT;
        }
        // Without a control file no XID can come: the whole timeout is
        // slept, as a driver's wait blocks, instead of polling.
        std::thread::sleep(if more { left.min(WAIT_POLL) } else { left });
    }
}
