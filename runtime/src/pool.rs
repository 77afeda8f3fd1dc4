//! The worker threads of a [`Session`](crate::Session) with more than one
//! thread.
//!
//! A schedule step may consist of several kernels (tasks) that the compiler
//! made independent: slices of one node's output. [`Pool::run`] runs the
//! tasks of one step on the calling thread and the workers together and
//! returns when all are done. Workers are created with the session and
//! parked on a condition variable between steps; a step publishes its
//! tasks under the mutex, then every thread claims task indices from an
//! atomic counter, so a run neither allocates nor creates threads.
//!
//! Steps follow each other every few tens of microseconds, while a
//! condition-variable wake-up costs several microseconds on each side.
//! So a worker first spins for [`SPIN`] on an atomic copy of the epoch
//! before it sleeps, and the caller spins as long for the last task before
//! it waits: on a busy schedule no thread sleeps between steps. The mutex
//! and condition variables stay the one source of truth; the spinning only
//! decides when to look at them.

use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::code::KernelFn;

/// One step's tasks: raw pointers, valid while [`Pool::run`] blocks.
#[derive(Clone, Copy)]
struct Job {
    entries: *const KernelFn,
    count: usize,
    arena: *mut u8,
    weights: *const u8,
}

// SAFETY: the pointers are only dereferenced while `Pool::run`, which owns
// the borrows they come from, waits for every task to finish.
unsafe impl Send for Job {}

struct State {
    /// Incremented for every published job; workers run each epoch once.
    epoch: u64,
    job: Option<Job>,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the workers when a job is published or on shutdown.
    wake: Condvar,
    /// Wakes the caller when the last task of a job finishes.
    done: Condvar,
    /// The next unclaimed task of the current job.
    next: AtomicUsize,
    /// Tasks of the current job finished so far.
    finished: AtomicUsize,
    /// The first non-zero kernel return code of the current job, or 0.
    code: AtomicI32,
    /// `State::epoch`, and bumped on shutdown, for the spinning workers.
    published: AtomicU64,
    /// Workers inside [`Shared::work`] (changed under the mutex): the
    /// caller waits for them to leave before the next job resets the task
    /// counter, so that none claims a task of the next job with this job's
    /// pointers.
    active: AtomicUsize,
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

/// Spins until `ready` holds or [`SPIN`] has passed; whether it held.
fn spin_until(ready: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= SPIN {
            return false;
        }
    }
}

impl Shared {
    /// Claims and runs tasks of `job` until none is left.
    fn work(&self, job: Job) {
        loop {
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            if i >= job.count {
                return;
            }
            // SAFETY: `i < count`, the length of the entries slice; the
            // kernels of one step write disjoint parts of the arena (the
            // compiler's partition), so running them concurrently is what
            // the artifact declares safe.
            let code = unsafe { (*job.entries.add(i))(job.arena, job.weights) };
            if code != 0 {
                let _ = self
                    .code
                    .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
            }
            if self.finished.fetch_add(1, Ordering::AcqRel) + 1 == job.count {
                // Taking the lock orders this wake-up after the caller's
                // check, so it cannot be missed.
                let _guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
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
            state: Mutex::new(State {
                epoch: 0,
                job: None,
                shutdown: false,
            }),
            wake: Condvar::new(),
            done: Condvar::new(),
            next: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            code: AtomicI32::new(0),
            published: AtomicU64::new(0),
            active: AtomicUsize::new(0),
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
    /// first non-zero return code (0 when all succeeded).
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
        let job = Job {
            entries: entries.as_ptr(),
            count: entries.len(),
            arena,
            weights,
        };
        let s = &*self.shared;
        {
            let mut state = s.state.lock().unwrap_or_else(|e| e.into_inner());
            s.next.store(0, Ordering::Release);
            s.finished.store(0, Ordering::Release);
            s.code.store(0, Ordering::Release);
            state.epoch += 1;
            state.job = Some(job);
            s.published.store(state.epoch, Ordering::Release);
            s.wake.notify_all();
        }
        s.work(job);
        let all_done = || {
            s.finished.load(Ordering::Acquire) >= job.count && s.active.load(Ordering::Acquire) == 0
        };
        spin_until(all_done);
        let mut state = s.state.lock().unwrap_or_else(|e| e.into_inner());
        while !all_done() {
            state = s.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        // No worker may touch this job's pointers after we return.
        state.job = None;
        s.code.load(Ordering::Acquire)
    }
}

fn worker(shared: &Shared) {
    let mut seen = 0u64;
    loop {
        spin_until(|| shared.published.load(Ordering::Acquire) != seen);
        let job = {
            let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if state.shutdown {
                    return;
                }
                if state.epoch != seen {
                    seen = state.epoch;
                    // None: the step finished without this worker; spin
                    // for the next one.
                    break state.job.inspect(|_| {
                        shared.active.fetch_add(1, Ordering::AcqRel);
                    });
                }
                state = shared.wake.wait(state).unwrap_or_else(|e| e.into_inner());
            }
        };
        let Some(job) = job else {
            continue;
        };
        shared.work(job);
        let _guard = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if shared.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            shared.done.notify_all();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        {
            let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            state.shutdown = true;
            self.shared.published.fetch_add(1, Ordering::AcqRel);
            self.shared.wake.notify_all();
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
}
