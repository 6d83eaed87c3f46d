//! A persistent team of worker threads that spin between jobs, for the CPU backend.
//!
//! A decode step is a few hundred small ops (a 576-wide matvec takes tens of
//! microseconds), so handing each op to rayon from the engine's thread — a cold
//! `install`, a futex wake of sleeping workers, a condvar wait for the answer — cost a
//! third of the CPU time. Here the calling thread is member 0 of the team and does its
//! share of every job; the other members spin on an epoch counter for a while after each
//! job (then park), so starting a job is one atomic store and finishing it one counter.
//!
//! The job is a borrowed closure; [`Team::run`] returns only after every member has
//! finished it, which is what makes lending it to the workers sound.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it parks: long enough to bridge the serial
/// work between two ops of a forward pass, short enough not to burn a core between
/// requests.
const SPIN: Duration = Duration::from_millis(2);

/// A job as the workers see it: the closure with its lifetime erased.
type Job = *const (dyn Fn(usize) + Sync + 'static);

struct Shared {
    /// Team size, the calling thread included.
    n: usize,
    /// Bumped once per job (and once to quit); workers run a job when it changes.
    epoch: AtomicUsize,
    /// Written by `run` before the epoch bump, read by workers after they see it.
    job: UnsafeCell<Option<Job>>,
    /// Workers that finished the current job.
    done: AtomicUsize,
    /// Per worker: parked (or about to park), so `run` must unpark it.
    sleeping: Vec<AtomicBool>,
    quit: AtomicBool,
    panicked: AtomicBool,
}

// SAFETY: `job` is written only by the thread holding `Team::lock`, before the epoch
// bump (SeqCst) that publishes it, and read by workers only after they observed that
// bump and before they report `done`; `run` does not touch it again until every worker
// has reported. The pointee is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// `n` threads (the caller of [`Team::run`] plus `n - 1` workers).
pub struct Team {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// One job at a time (backends sharing a team run their ops in turn).
    lock: Mutex<()>,
}

impl Team {
    /// A team of `n` threads (at least 1).
    pub fn new(n: usize) -> std::io::Result<Team> {
        let n = n.max(1);
        let shared = Arc::new(Shared {
            n,
            epoch: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            done: AtomicUsize::new(0),
            sleeping: (1..n).map(|_| AtomicBool::new(false)).collect(),
            quit: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
        });
        let mut team = Team { shared: shared.clone(), workers: Vec::new(), lock: Mutex::new(()) };
        for id in 1..n {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("lode-cpu-{id}"))
                .spawn(move || worker(&s, id))?;
            team.workers.push(h);
        }
        Ok(team)
    }

    /// Threads in the team, the caller included.
    pub fn threads(&self) -> usize {
        self.shared.n
    }

    /// Runs `f(member)` once on every member `0..threads()` (the caller is member 0) and
    /// returns when all have finished. A panic in any member is re-raised here.
    /// `f` must not call `run` of the same team.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        let s = &*self.shared;
        if s.n == 1 {
            f(0);
            return;
        }
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let short: *const (dyn Fn(usize) + Sync + '_) = f;
        // SAFETY: only the lifetime is erased; the workers drop every use of the
        // pointer before they increment `done`, and we wait for all of them below
        // before `f`'s borrow ends.
        let job: Job = unsafe { std::mem::transmute(short) };
        s.done.store(0, Relaxed);
        // SAFETY: see `impl Sync for Shared`: we hold the lock and no worker reads
        // `job` until the epoch changes.
        unsafe { *s.job.get() = Some(job) };
        s.epoch.fetch_add(1, SeqCst);
        for (w, h) in s.sleeping.iter().zip(&self.workers) {
            if w.load(SeqCst) {
                h.thread().unpark();
            }
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        let mut spins = 0u32;
        while s.done.load(Acquire) != s.n - 1 {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: every worker has finished with the job.
        unsafe { *s.job.get() = None };
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if s.panicked.swap(false, SeqCst) {
            panic!("a CPU worker thread panicked");
        }
    }

    /// Calls `f(i)` for every `i < n_tasks`, members taking the next task as they finish
    /// one (tasks are claimed in increasing order).
    pub fn for_each(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        match n_tasks {
            0 => {}
            1 => f(0),
            _ => {
                let next = AtomicUsize::new(0);
                self.run(&|_| loop {
                    let i = next.fetch_add(1, Relaxed);
                    if i >= n_tasks {
                        break;
                    }
                    f(i);
                });
            }
        }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.quit.store(true, SeqCst);
        s.epoch.fetch_add(1, SeqCst);
        for h in &self.workers {
            h.thread().unpark();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker(s: &Shared, id: usize) {
    let mut seen = s.epoch.load(SeqCst);
    let sleeping = &s.sleeping[id - 1];
    loop {
        let mut idle_since: Option<Instant> = None;
        let mut spins = 0u32;
        loop {
            let e = s.epoch.load(Acquire);
            if e != seen {
                seen = e;
                break;
            }
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                let t0 = *idle_since.get_or_insert_with(Instant::now);
                if t0.elapsed() > SPIN {
                    sleeping.store(true, SeqCst);
                    if s.epoch.load(SeqCst) == seen {
                        std::thread::park();
                    }
                    sleeping.store(false, SeqCst);
                    idle_since = None;
                }
            }
            std::hint::spin_loop();
        }
        if s.quit.load(SeqCst) {
            return;
        }
        // SAFETY: the epoch changed, so `run` published a job and waits for our `done`.
        let job = unsafe { *s.job.get() };
        if let Some(job) = job {
            // SAFETY: the closure outlives this call (see `Team::run`).
            let f = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| f(id))).is_err() {
                s.panicked.store(true, SeqCst);
            }
        }
        s.done.fetch_add(1, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_member_runs_each_job_once() {
        let team = Team::new(3).unwrap();
        for _ in 0..200 {
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            team.run(&|m| {
                hits[m].fetch_add(1, Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1));
        }
    }

    #[test]
    fn for_each_covers_all_tasks_after_workers_park() {
        let team = Team::new(2).unwrap();
        std::thread::sleep(SPIN * 3);
        let sum = AtomicUsize::new(0);
        team.for_each(1000, &|i| {
            sum.fetch_add(i, Relaxed);
        });
        assert_eq!(sum.load(Relaxed), 999 * 1000 / 2);
    }

    #[test]
    fn a_worker_panic_reaches_the_caller() {
        let team = Team::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| team.run(&|m| assert_ne!(m, 1, "boom"))));
        assert!(r.is_err());
        // The team still works afterwards.
        let n = AtomicUsize::new(0);
        team.run(&|_| {
            n.fetch_add(1, Relaxed);
        });
        assert_eq!(n.load(Relaxed), 2);
    }
}
