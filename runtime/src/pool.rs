//! The worker threads of a [`Session`](crate::Session) with more than one
//! thread.
//!
//! A schedule step may consist of several kernels (tasks) that the compiler
//! made independent: slices of one node's output. [`Pool::run`] runs the
//! tasks of one step on the calling thread and the workers together and
//! returns when all are done. Workers are created with the session, so a
//! run neither allocates nor creates threads.
//!
//! Steps follow each other every few microseconds (a recurrent layer's
//! steps, each a matrix-vector product split in two), so handing a step
//! over takes no lock on the busy path: the caller writes the job into
//! atomics and bumps an epoch, spinning workers see it and claim task
//! indices with a compare-and-swap on a counter tagged with the epoch, and
//! the caller spins on a finished count. A worker that is late for a step
//! finds the counter tagged with a newer epoch and claims nothing, so it
//! never runs a task with another step's pointers. (The pool this replaced
//! published under a mutex and woke the workers with a condition variable
//! on every step: see `pool::tests::hand_over_cost` for the numbers.)
//!
//! Threads spin for [`SPIN`] before they sleep on a condition variable;
//! the sleeper counts tell the other side when it must take the mutex to
//! wake them, in sequentially consistent order so that no wake-up is lost.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::code::KernelFn;

/// Bits of [`Shared::claim`] below the epoch: the next unclaimed task.
/// The other 40 hold the epoch's low bits, so a worker would have to stall
/// between reading a job and claiming its task for 2^40 steps (hours at
/// the fastest hand-over) to see its tag come round again.
const TASK_BITS: u32 = 24;
const TASK_MASK: u64 = (1 << TASK_BITS) - 1;

/// The claim counter's value at the start of job `epoch` (its low bits
/// above the task bits; the shift drops the rest).
fn tag(epoch: u64) -> u64 {
    epoch << TASK_BITS
}

struct Shared {
    /// The current job, written by the caller before it publishes the
    /// epoch. Atomics, because a late worker may read them while the next
    /// job is written: it then fails its claim and uses none of them.
    entries: AtomicPtr<KernelFn>,
    count: AtomicUsize,
    arena: AtomicPtr<u8>,
    weights: AtomicPtr<u8>,
    /// The low 32 bits of the current epoch, then the next unclaimed task.
    claim: AtomicU64,
    /// Tasks of the current job finished so far.
    finished: AtomicUsize,
    /// The first non-zero kernel return code of the current job, or 0.
    code: AtomicI32,
    /// Incremented for every published job and on shutdown.
    published: AtomicU64,
    shutdown: AtomicBool,
    /// Workers asleep (or about to sleep) on `wake`.
    sleepers: AtomicUsize,
    /// Whether the caller sleeps (or is about to) on `done`.
    caller_sleeps: AtomicBool,
    /// Guards only the sleeping: taken to wait and to notify.
    sleep: Mutex<()>,
    /// Wakes the workers when a job is published or on shutdown.
    wake: Condvar,
    /// Wakes the caller when the last task of a job finishes.
    done: Condvar,
}

/// How long a thread spins before sleeping (see the module docs). Long
/// enough to span a run of single-task steps (a squeeze-excite block's
/// pooling and two small convolutions take 50–150 µs): with 100 µs the
/// worker slept through them and the next split step paid its wake-up.
/// 1 ms against 100 µs, 2 threads, p50 of 100 runs (`kiln bench --random
/// --threads 2`, full-size zoo models, 2026-12-05): EfficientNet 8.68 →
/// 8.19 ms, MobileNetV3 4.40–4.51 → 4.07–4.32 ms, MobileNetV2 4.40–4.42 →
/// 4.22–4.35 ms, Inception 60.2–60.8 → 57.8–58.8 ms, ResNet-18 unchanged
/// within noise. An idle session's workers spin at most this long after a
/// run before they sleep.
const SPIN: Duration = Duration::from_micros(1000);

/// Rounds of 64 spins (a few microseconds) before a spinning thread also
/// yields its core between rounds: with more threads than free cores (a
/// session of 8 threads on 2 cores, or two sessions of 2), a thread that
/// only spins keeps the one holding a task off the core. MobileNetV2
/// compiled with `--threads 8`, on this 2-core machine (`kiln bench
/// --random --runs 200 --threads T`, 2026-12-07): 8 threads 20–28 ms p50
/// spinning only, 5.2–8.7 ms with the yield; 4 threads 16.7 → 8.5 ms; at
/// 2 threads (its default artifact) 4.2–4.8 ms either way.
const SPIN_ROUNDS_BEFORE_YIELD: u32 = 16;

/// Spins until `ready` holds or [`SPIN`] has passed; whether it held.
fn spin_until(ready: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    let mut rounds = 0u32;
    loop {
        for _ in 0..64 {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        rounds += 1;
        if rounds > SPIN_ROUNDS_BEFORE_YIELD {
            std::thread::yield_now();
        }
        if start.elapsed() >= SPIN {
            return false;
        }
    }
}

impl Shared {
    /// Claims and runs tasks of the job of `epoch` until none is left, or
    /// returns at once when a newer job has replaced it.
    fn work(&self, epoch: u64) {
        let tag = tag(epoch);
        // Read before any claim: a value from a newer job was written after
        // that job retagged `claim` (Release/Acquire), so the claim below
        // then sees the newer tag and fails.
        let entries = self.entries.load(Ordering::Acquire);
        let count = self.count.load(Ordering::Acquire);
        let arena = self.arena.load(Ordering::Acquire);
        let weights = self.weights.load(Ordering::Acquire);
        let mut current = self.claim.load(Ordering::Acquire);
        loop {
            let i = (current & TASK_MASK) as usize;
            if current & !TASK_MASK != tag || i >= count {
                return;
            }
            match self.claim.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {}
                Err(seen) => {
                    current = seen;
                    continue;
                }
            }
            current += 1;
            // SAFETY: the claim succeeded with this job's tag, so the job is
            // still running: the caller waits in `Pool::run` for this
            // task's `finished` count before it retags the counter or
            // lets the borrows behind these pointers end. `i < count`, the
            // length of the entries slice. The kernels of one step write
            // disjoint parts of the arena (the compiler's partition), so
            // running them concurrently is what the artifact declares safe.
            let code = unsafe { (*entries.add(i))(arena, weights as *const u8) };
            if code != 0 {
                let _ = self
                    .code
                    .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
            }
            if self.finished.fetch_add(1, Ordering::SeqCst) + 1 == count
                && self.caller_sleeps.load(Ordering::SeqCst)
            {
                // Taking the lock orders this wake-up after the caller's
                // last check, so it cannot be missed.
                let _guard = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
                self.done.notify_all();
            }
        }
    }
}

/// Worker threads shared by the steps of one session.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool where `threads` threads (the caller and `threads - 1`
    /// workers) run each step's tasks.
    pub(crate) fn new(threads: usize) -> std::io::Result<Pool> {
        Pool::start(threads, |i, shared| {
            std::thread::Builder::new()
                .name(format!("kiln-worker-{i}"))
                .spawn(move || worker(&shared))
        })
    }

    /// [`Pool::new`] with the way worker `i` is started given.
    fn start(
        threads: usize,
        mut spawn: impl FnMut(usize, Arc<Shared>) -> std::io::Result<JoinHandle<()>>,
    ) -> std::io::Result<Pool> {
        let shared = Arc::new(Shared {
            entries: AtomicPtr::new(std::ptr::null_mut()),
            count: AtomicUsize::new(0),
            arena: AtomicPtr::new(std::ptr::null_mut()),
            weights: AtomicPtr::new(std::ptr::null_mut()),
            claim: AtomicU64::new(0),
            finished: AtomicUsize::new(0),
            code: AtomicI32::new(0),
            published: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            caller_sleeps: AtomicBool::new(false),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            done: Condvar::new(),
        });
        // Built before the workers so that, if a spawn fails, dropping it
        // shuts down and joins the workers already started.
        let mut pool = Pool {
            shared,
            workers: Vec::new(),
        };
        for i in 1..threads {
            let handle = spawn(i, Arc::clone(&pool.shared))?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Threads running each step (the caller included).
    pub(crate) fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs every kernel of `entries` once, concurrently, and returns the
    /// first non-zero return code (0 when all succeeded). One caller at a
    /// time (`&mut` sessions own their pool).
    ///
    /// # Safety
    /// The kernels must be safe to run concurrently on this arena and
    /// weights (they write disjoint bytes and read nothing another writes).
    pub(crate) unsafe fn run(
        &self,
        entries: &[KernelFn],
        arena: *mut u8,
        weights: *const u8,
    ) -> i32 {
        let s = &*self.shared;
        let count = entries.len();
        if count as u64 > TASK_MASK {
            // More tasks than the claim counter holds (no compiler makes
            // such a step): run them here, one after another.
            let mut first = 0;
            for entry in entries {
                // SAFETY: the caller's contract; one task at a time is
                // safer still than the concurrency it allows.
                let code = unsafe { entry(arena, weights) };
                if first == 0 {
                    first = code;
                }
            }
            return first;
        }
        // Every task of the previous job has finished (this function
        // waited for them), so no worker runs with the fields below.
        let epoch = s.published.load(Ordering::Relaxed) + 1;
        // Retag first: a late worker that reads any field written below
        // then also sees the new tag and claims nothing.
        s.claim.store(tag(epoch), Ordering::Release);
        s.finished.store(0, Ordering::Release);
        s.code.store(0, Ordering::Release);
        s.entries
            .store(entries.as_ptr() as *mut KernelFn, Ordering::Release);
        s.count.store(count, Ordering::Release);
        s.arena.store(arena, Ordering::Release);
        s.weights.store(weights as *mut u8, Ordering::Release);
        s.published.store(epoch, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        s.work(epoch);
        let all_done = || s.finished.load(Ordering::SeqCst) >= count;
        if !spin_until(all_done) {
            let mut guard = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.caller_sleeps.store(true, Ordering::SeqCst);
            while !all_done() {
                guard = s.done.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            s.caller_sleeps.store(false, Ordering::SeqCst);
        }
        s.code.load(Ordering::Acquire)
    }
}

fn worker(shared: &Shared) {
    let mut seen = 0u64;
    loop {
        let fresh = || shared.published.load(Ordering::SeqCst) != seen;
        if !spin_until(fresh) {
            let mut guard = shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            shared.sleepers.fetch_add(1, Ordering::SeqCst);
            while !fresh() {
                guard = shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            shared.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        if shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        seen = shared.published.load(Ordering::Acquire);
        shared.work(seen);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let s = &self.shared;
        s.shutdown.store(true, Ordering::SeqCst);
        {
            let _guard = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.published.fetch_add(1, Ordering::SeqCst);
            s.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Pool;
    use crate::code::KernelFn;

    unsafe extern "C" fn add_one(arena: *mut u8, _weights: *const u8) -> i32 {
        // The "arena" of this test is one shared atomic counter.
        let slot = arena as *mut std::sync::atomic::AtomicU64;
        (*slot).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        0
    }

    unsafe extern "C" fn fail(_arena: *mut u8, _weights: *const u8) -> i32 {
        7
    }

    #[test]
    fn a_failed_spawn_stops_the_workers_already_started() {
        let mut shared = None;
        let result = Pool::start(6, |i, s| {
            shared.get_or_insert_with(|| std::sync::Arc::downgrade(&s));
            if i == 4 {
                return Err(std::io::Error::other("no more threads"));
            }
            Ok(std::thread::spawn(move || super::worker(&s)))
        });
        assert!(result.is_err());
        // Every worker returned and dropped its reference to the state.
        assert_eq!(shared.unwrap().strong_count(), 0);
    }

    #[test]
    fn every_task_runs_once_per_step_and_errors_come_back() {
        let pool = Pool::new(3).unwrap();
        assert_eq!(pool.threads(), 3);
        let counter = std::sync::atomic::AtomicU64::new(0);
        let arena = &counter as *const _ as *mut u8;
        let tasks: Vec<KernelFn> = vec![add_one; 5];
        // SAFETY (every `pool.run` below): the tasks only touch the atomic
        // counter the "arena" points to, and read no weights.
        for _ in 0..200 {
            // SAFETY: see above.
            assert_eq!(unsafe { pool.run(&tasks, arena, std::ptr::null()) }, 0);
        }
        assert_eq!(counter.load(std::sync::atomic::Ordering::Relaxed), 1000);
        let mixed: Vec<KernelFn> = vec![add_one, fail, add_one];
        // SAFETY: see above.
        assert_eq!(unsafe { pool.run(&mixed, arena, std::ptr::null()) }, 7);
        // SAFETY: see above.
        assert_eq!(unsafe { pool.run(&tasks, arena, std::ptr::null()) }, 0);
    }

    unsafe extern "C" fn add_one_slowly(arena: *mut u8, weights: *const u8) -> i32 {
        std::thread::sleep(std::time::Duration::from_millis(3));
        add_one(arena, weights)
    }

    #[test]
    fn steps_after_the_threads_slept_still_run_every_task() {
        // Each pause outlasts the spin, so the workers sleep between steps
        // and the caller sleeps while the slow tasks run: both wake-ups.
        let pool = Pool::new(3).unwrap();
        let counter = std::sync::atomic::AtomicU64::new(0);
        let arena = &counter as *const _ as *mut u8;
        let tasks: Vec<KernelFn> = vec![add_one_slowly; 4];
        for _ in 0..5 {
            // SAFETY: the tasks only touch the atomic counter behind
            // `arena`, which outlives the pool's use of it.
            assert_eq!(unsafe { pool.run(&tasks, arena, std::ptr::null()) }, 0);
            std::thread::sleep(super::SPIN * 3);
        }
        assert_eq!(counter.load(std::sync::atomic::Ordering::Relaxed), 20);
    }

    /// A measurement, not a test (nothing here is timed against a bound):
    /// the cost of handing one step of two empty tasks to the pool, run
    /// with `cargo test --release -p kiln-runtime --lib hand_over_cost --
    /// --ignored --nocapture`. On this 2-core machine: 1.1 µs per step
    /// with the mutex-and-condition-variable pool this one replaced,
    /// 0.15–0.17 µs with the lock-free hand-over, 0.04 µs once spinning
    /// threads also yield (the caller then often runs both empty tasks
    /// before the worker looks; 2026-12-07).
    #[test]
    #[ignore = "a measurement; run it by name"]
    fn hand_over_cost() {
        unsafe extern "C" fn nothing(_arena: *mut u8, _weights: *const u8) -> i32 {
            0
        }
        let pool = Pool::new(2).unwrap();
        let tasks: Vec<KernelFn> = vec![nothing; 2];
        let steps = 200_000;
        let mut elapsed = std::time::Duration::ZERO;
        for round in 0..2 {
            let start = std::time::Instant::now();
            for _ in 0..steps {
                // SAFETY: the tasks touch no memory.
                let code = unsafe { pool.run(&tasks, std::ptr::null_mut(), std::ptr::null()) };
                assert_eq!(code, 0);
            }
            if round == 1 {
                elapsed = start.elapsed();
            }
        }
        eprintln!("{:?} per step of two empty tasks", elapsed / steps);
    }
}
