//! A persistent team of worker threads that spin between jobs, for the CPU backend.
//!
//! A decode step is a few hundred small ops (a 576-wide matvec takes tens of
//! microseconds), so handing each op to rayon from the engine's thread — a cold
//! `install`, a futex wake of sleeping workers, a condvar wait for the answer — cost a
//! third of the CPU time. Here the calling thread takes part in every job; the workers
//! spin on an epoch counter for a while after each job (yielding, then parking), so
//! starting a job is one atomic store.
//!
//! A job is a list of tasks claimed by index. A worker *joins* a job only while it is
//! open; the caller closes it once every task has been claimed and then waits only for
//! the workers that joined. So a worker that the OS has not scheduled (a loaded machine)
//! never holds the caller up: the caller runs the tasks itself and the late worker skips
//! the job. The job is a borrowed closure; [`Team::for_each`] returns only after every
//! worker that joined has finished with it, which is what makes lending it sound.
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// An idle worker spins (`spin_loop`) this long after a job: the gaps between the ops
/// of a forward pass are shorter.
const SPIN: Duration = Duration::from_micros(100);
/// Then it yields the core to other processes between checks for this long, then parks.
const YIELD: Duration = Duration::from_millis(2);

/// A job as the workers see it: the task body with its lifetime erased.
type Job = *const (dyn Fn() + Sync + 'static);

/// `join` word: the job's epoch in the high 32 bits, [`CLOSED`], then the number of
/// workers that joined.
const CLOSED: u64 = 1 << 31;

struct Shared {
    /// Team size, the calling thread included.
    n: usize,
    /// Bumped once per job (and once to quit); workers look at a job when it changes.
    epoch: AtomicUsize,
    /// Which job may be joined, and by how many workers it was.
    join: AtomicU64,
    /// Written by the caller before the epoch bump, read by workers that joined.
    job: UnsafeCell<Option<Job>>,
    /// Workers that joined the current job and finished it.
    done: AtomicUsize,
    /// Per worker: parked (or about to park), so a new job must unpark it.
    sleeping: Vec<AtomicBool>,
    quit: AtomicBool,
    panicked: AtomicBool,
}

// SAFETY: `job` is written only by the thread holding `Team::lock`, while no worker has
// joined (before the epoch bump that announces the job, and after every worker that
// joined has reported `done`); workers read it only between a successful join of the
// current epoch and their `done`. The pointee is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// `n` threads: whoever calls [`Team::for_each`] plus `n - 1` workers.
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
            join: AtomicU64::new(CLOSED),
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

    /// Calls `f(i)` once for every `i < n_tasks` and returns when all calls have
    /// finished. Threads claim the next task as they finish one (in increasing order);
    /// the calling thread always takes part. A panic in any task is re-raised here.
    /// `f` must not start another job on the same team.
    pub fn for_each(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let s = &*self.shared;
        if n_tasks <= 1 || s.n == 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let next = AtomicUsize::new(0);
        let body = || loop {
            let i = next.fetch_add(1, Relaxed);
            if i >= n_tasks {
                break;
            }
            f(i);
        };
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let short: *const (dyn Fn() + Sync + '_) = &body;
        // SAFETY: only the lifetime is erased; workers use the pointer only between
        // joining and `done`, and we wait for every worker that joined before `body`'s
        // borrow ends.
        let job: Job = unsafe { std::mem::transmute(short) };
        // SAFETY: see `impl Sync for Shared`: we hold the lock and no worker has joined.
        unsafe { *s.job.get() = Some(job) };
        s.done.store(0, Relaxed);
        let epoch = s.epoch.load(Relaxed).wrapping_add(1);
        s.join.store((epoch as u64 & 0xffff_ffff) << 32, SeqCst);
        s.epoch.store(epoch, SeqCst);
        for (w, h) in s.sleeping.iter().zip(&self.workers) {
            if w.load(SeqCst) {
                h.thread().unpark();
            }
        }
        let mine = catch_unwind(AssertUnwindSafe(body));
        // Every task is claimed: no worker may join from now on.
        let joined = (s.join.fetch_or(CLOSED, SeqCst) & (CLOSED - 1)) as usize;
        let mut spins = 0u32;
        while s.done.load(Acquire) != joined {
            spins += 1;
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: every worker that joined has finished with the job; no other can join.
        unsafe { *s.job.get() = None };
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if s.panicked.swap(false, SeqCst) {
            panic!("a CPU worker thread panicked");
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

/// Joins the job of `epoch` if it is still open.
fn try_join(s: &Shared, epoch: usize) -> bool {
    let mut j = s.join.load(SeqCst);
    loop {
        if j >> 32 != epoch as u64 & 0xffff_ffff || j & CLOSED != 0 {
            return false;
        }
        match s.join.compare_exchange_weak(j, j + 1, SeqCst, SeqCst) {
            Ok(_) => return true,
            Err(now) => j = now,
        }
    }
}

fn worker(s: &Shared, id: usize) {
    // The epoch starts at 0: a worker that starts late still sees every bump since,
    // the quitting one included (loading it here could miss that).
    let mut seen = 0;
    let sleeping = &s.sleeping[id - 1];
    loop {
        let idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            let e = s.epoch.load(Acquire);
            if e != seen {
                seen = e;
                break;
            }
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 {
                let idle = idle_since.elapsed();
                if idle > YIELD {
                    sleeping.store(true, SeqCst);
                    if s.epoch.load(SeqCst) == seen && !s.quit.load(SeqCst) {
                        std::thread::park();
                    }
                    sleeping.store(false, SeqCst);
                } else if idle > SPIN {
                    std::thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
        if s.quit.load(SeqCst) {
            return;
        }
        if !try_join(s, seen) {
            continue;
        }
        // SAFETY: we joined the open job, so the caller published it and waits for our
        // `done` before it ends the borrow (see `Team::for_each`).
        if let Some(job) = unsafe { *s.job.get() } {
            // SAFETY: as above.
            let f = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(f)).is_err() {
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
    fn for_each_runs_every_task_once() {
        let team = Team::new(3).unwrap();
        for n in [0, 1, 2, 7, 100] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            team.for_each(n, &|i| {
                hits[i].fetch_add(1, Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "{n} tasks");
        }
    }

    #[test]
    fn for_each_covers_all_tasks_after_workers_park() {
        let team = Team::new(2).unwrap();
        std::thread::sleep(YIELD * 3);
        let sum = AtomicUsize::new(0);
        team.for_each(1000, &|i| {
            sum.fetch_add(i, Relaxed);
        });
        assert_eq!(sum.load(Relaxed), 999 * 1000 / 2);
    }

    #[test]
    fn workers_take_part() {
        let team = Team::new(2).unwrap();
        let seen = Mutex::new(std::collections::HashSet::new());
        for _ in 0..50 {
            team.for_each(64, &|_| {
                seen.lock().unwrap().insert(std::thread::current().id());
                std::thread::sleep(Duration::from_micros(50));
            });
        }
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_task_panic_reaches_the_caller() {
        let team = Team::new(2).unwrap();
        for _ in 0..20 {
            let r = catch_unwind(AssertUnwindSafe(|| team.for_each(8, &|i| assert_ne!(i, 5, "boom"))));
            assert!(r.is_err());
        }
        // The team still works afterwards.
        let n = AtomicUsize::new(0);
        team.for_each(10, &|_| {
            n.fetch_add(1, Relaxed);
        });
        assert_eq!(n.load(Relaxed), 10);
    }
}
