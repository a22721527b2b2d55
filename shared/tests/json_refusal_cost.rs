//! What refusing a JSON frame costs: a facility bridge reads any line the
//! broker hands it (`Frame::from_json`), so finding where an unknown name
//! is must cost in proportion to the line, whatever its shape. Counted in
//! bytes allocated, not in time, so the check does not depend on the
//! machine. One test in this binary, so nothing else allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use loopwarden_protocol::json::JsonError;
use loopwarden_protocol::{samples, Frame, MessageKind};

/// The system allocator, counting the bytes it hands out.
struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size, Ordering::Relaxed);
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// A body with an unknown reason and, beside it, an extra field of a long
/// key over many items (the reader ignores it; the search for the name
/// walks it): the refusal names the reason's field, and allocates a few
/// dozen bytes per byte of the line, not the key's length per item.
#[test]
fn refusing_an_unknown_name_costs_in_proportion_to_the_line() {
    let key = "a".repeat(100_000);
    let items = vec!["{}"; 5_000].join(",");
    let good = samples::frame(MessageKind::HostHealth).to_json();
    let line = good
        .replace(r#""reason":"xid-79""#, r#""reason":"xid-1000""#)
        .replacen(r#""body":{"#, &format!(r#""body":{{"{key}":[{items}],"#), 1);
    assert!(line.len() > 100_000 && line.contains("xid-1000"));
    let before = ALLOCATED.load(Ordering::Relaxed);
    let e = Frame::from_json(&line).unwrap_err();
    let spent = ALLOCATED.load(Ordering::Relaxed) - before;
    match &e {
        JsonError::UnknownName { name, field, .. } => {
            assert_eq!(
                (name.as_str(), field.as_str()),
                ("xid-1000", "body.gpus[3].reason")
            )
        }
        e => panic!("{e:?}"),
    }
    assert!(
        spent <= 40 * line.len(),
        "{spent} bytes allocated to refuse a line of {} bytes",
        line.len()
    );
}
