//! Loading costs what the file is worth: artifacts with extreme but
//! well-formed tables (every checksum right) load in well under a second,
//! and the heap the loader allocates stays a small multiple of the file's
//! size, measured with a counting allocator. (The file's private copy and
//! the arena are anonymous mappings, not heap: the file copy is the file's
//! size, the arena is reserved address space until touched.)
#![cfg(target_arch = "x86_64")]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{kernel, return_code, single_kernel, spec};
use kiln_runtime::format::{DType, Step};
use kiln_runtime::{Model, TensorRef};

/// The system allocator, counting live bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Loads `bytes` from a file; returns the model, the load time and the
/// peak heap bytes the load added.
fn load_measured(tag: &str, bytes: &[u8]) -> (Model, Duration, usize) {
    let path = std::env::temp_dir().join(format!("kiln-bounds-{}-{tag}", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let start = Instant::now();
    let model = Model::load(&path).unwrap();
    let time = start.elapsed();
    let peak = PEAK.load(Ordering::Relaxed) - base;
    std::fs::remove_file(&path).unwrap();
    eprintln!(
        "{tag}: {} bytes loaded in {:.1} ms, peak heap {} bytes ({:.2}x the file)",
        bytes.len(),
        time.as_secs_f64() * 1e3,
        peak,
        peak as f64 / bytes.len() as f64
    );
    (model, time, peak)
}

/// Many steps, each naming the same long run of kernels as its tasks: a
/// task table expanded per step would be steps x tasks entries (here
/// 50,000 x 20,000, 8 GB of entry points) for a file of about 2 MB.
#[test]
fn steps_sharing_many_tasks_cost_what_the_file_is_worth() {
    let (kernels, steps) = (20_000u32, 50_000);
    let mut a = single_kernel(&return_code(0), vec![], vec![]);
    a.kernels = (0..kernels).map(|_| kernel("", 0, 6)).collect();
    a.profiles[0].schedule = (0..steps)
        .map(|_| Step {
            kernel: 0,
            tasks: kernels,
            node: String::new(),
        })
        .collect();
    let bytes = a.to_bytes();
    let (model, time, peak) = load_measured("steps", &bytes);
    assert_eq!(model.max_tasks(), kernels as usize);
    assert!(time < Duration::from_secs(1), "{time:?}");
    assert!(
        peak <= 8 * bytes.len(),
        "{peak} bytes for a {} byte file",
        bytes.len()
    );
}

/// 100,000 inputs: the names are checked with a hash set at load and
/// matched through an index at run time, not pairwise.
#[test]
fn a_hundred_thousand_inputs_load_and_bind_in_linear_time() {
    let n = 100_000u64;
    let inputs = (0..n)
        .map(|i| spec(&format!("input{i}"), DType::F32, &[], 4 * i))
        .collect();
    let mut a = single_kernel(&return_code(0), inputs, vec![]);
    a.profiles[0].arena_size = 4 * n;
    let bytes = a.to_bytes();
    let (model, time, peak) = load_measured("inputs", &bytes);
    assert!(time < Duration::from_secs(1), "{time:?}");
    assert!(
        peak <= 8 * bytes.len(),
        "{peak} bytes for a {} byte file",
        bytes.len()
    );
    let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let names: Vec<String> = (0..n).rev().map(|i| format!("input{i}")).collect();
    let given: Vec<TensorRef<'_>> = (names.iter())
        .map(|name| {
            let i: usize = name["input".len()..].parse().unwrap();
            TensorRef::from_slice(name, &[], &values[i..i + 1])
        })
        .collect();
    let start = Instant::now();
    model.run(&given).unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    // A duplicate among them is still found.
    let mut twice = given.clone();
    twice[n as usize - 1] = given[0];
    let err = model.run(&twice).unwrap_err();
    assert!(err.to_string().contains("more than once"), "{err}");
}
