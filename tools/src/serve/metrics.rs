//! Counters and gauges for `GET /metrics` in Prometheus' text format. Everything is an
//! atomic or a short critical section: workers update per token, scrapes only read.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

/// Width of the window `lode_generated_tokens_per_second` averages over.
const RATE_WINDOW_S: u64 = 10;

/// The server's counters.
pub struct Metrics {
    start: Instant,
    /// (endpoint, HTTP status) → count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub prompt_tokens: AtomicU64,
    pub cached_prompt_tokens: AtomicU64,
    /// Prompt tokens whose K/V was copied from another slot's cache.
    pub shared_prompt_tokens: AtomicU64,
    /// Requests that looked in the prompt cache (`cache_prompt` on), and those that
    /// reused at least one cached token.
    pub prompt_cache_lookups: AtomicU64,
    pub prompt_cache_hits: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub prompt_us: AtomicU64,
    pub decode_us: AtomicU64,
    pub cancelled: AtomicU64,
    pub worker_panics: AtomicU64,
    pub queue_depth: AtomicUsize,
    pub active_slots: AtomicUsize,
    pub slots: usize,
    /// Per slot: whether it is generating now (`/slots`).
    busy: Vec<std::sync::atomic::AtomicBool>,
    /// Bytes of device memory the backends hold (0 on the CPU).
    pub device_memory_bytes: AtomicU64,
    /// Copies of the weights resident in device memory (0 on the CPU: it reads the
    /// mapped file in place).
    pub weight_copies: AtomicU64,
    /// Batched decode steps run, and the sequences they carried (rows / steps is the
    /// mean batch size).
    pub batch_steps: AtomicU64,
    pub batch_rows: AtomicU64,
    /// Prompt chunks evaluated (chunked prefill), and those carried by a decode step.
    pub prefill_chunks: AtomicU64,
    pub prefill_chunks_mixed: AtomicU64,
    /// Decode steps that waited for a prompt chunk (one in their pass, or one evaluated
    /// alone while they waited): their count, summed and longest wait (ask to logits).
    prefill_waits: AtomicU64,
    prefill_wait_us: AtomicU64,
    prefill_wait_max_us: AtomicU64,
    /// Speculative verify chunks run (`--spec-type`), and the drafted tokens they checked.
    pub spec_passes: AtomicU64,
    pub spec_drafted: AtomicU64,
    /// Of those, the drafted tokens the target accepted (counted when a request ends).
    pub spec_accepted: AtomicU64,
    /// `--model-draft` / `--spec-type draft-mtp`: drafting rounds (of the draft thread,
    /// or of the MTP block on the engine thread) and the slots' requests they served
    /// together (requests / rounds is the mean draft batch).
    pub draft_batches: AtomicU64,
    pub draft_requests: AtomicU64,
    /// Token masks of structured output (`response_format`, `json_schema`, `grammar`).
    pub grammar: std::sync::Arc<super::structured::GrammarStats>,
    /// Generated tokens per second of uptime, for the last [`RATE_WINDOW_S`] seconds.
    recent: Mutex<VecDeque<(u64, u64)>>,
}

impl Metrics {
    pub fn new(slots: usize) -> Metrics {
        Metrics {
            start: Instant::now(),
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            cached_prompt_tokens: AtomicU64::new(0),
            shared_prompt_tokens: AtomicU64::new(0),
            prompt_cache_lookups: AtomicU64::new(0),
            prompt_cache_hits: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            prompt_us: AtomicU64::new(0),
            decode_us: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            worker_panics: AtomicU64::new(0),
            queue_depth: AtomicUsize::new(0),
            active_slots: AtomicUsize::new(0),
            slots,
            busy: (0..slots).map(|_| std::sync::atomic::AtomicBool::new(false)).collect(),
            device_memory_bytes: AtomicU64::new(0),
            weight_copies: AtomicU64::new(0),
            batch_steps: AtomicU64::new(0),
            batch_rows: AtomicU64::new(0),
            prefill_chunks: AtomicU64::new(0),
            prefill_chunks_mixed: AtomicU64::new(0),
            prefill_waits: AtomicU64::new(0),
            prefill_wait_us: AtomicU64::new(0),
            prefill_wait_max_us: AtomicU64::new(0),
            spec_passes: AtomicU64::new(0),
            spec_drafted: AtomicU64::new(0),
            spec_accepted: AtomicU64::new(0),
            draft_batches: AtomicU64::new(0),
            draft_requests: AtomicU64::new(0),
            grammar: Default::default(),
            recent: Mutex::new(VecDeque::new()),
        }
    }

    /// A decode step that waited `d` (from its ask to its logits) for a prompt chunk.
    pub fn prefill_wait(&self, d: std::time::Duration) {
        let us = d.as_micros() as u64;
        self.prefill_waits.fetch_add(1, Relaxed);
        self.prefill_wait_us.fetch_add(us, Relaxed);
        self.prefill_wait_max_us.fetch_max(us, Relaxed);
    }

    pub fn request(&self, endpoint: &str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((endpoint.to_string(), status)).or_default() += 1;
    }

    /// One generated token, for the rate window (totals are added per request).
    pub fn set_busy(&self, slot: usize, busy: bool) {
        if let Some(b) = self.busy.get(slot) {
            b.store(busy, Relaxed);
        }
    }

    pub fn is_busy(&self, slot: usize) -> bool {
        self.busy.get(slot).is_some_and(|b| b.load(Relaxed))
    }

    pub fn token(&self) {
        let sec = self.start.elapsed().as_secs();
        let mut r = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        match r.back_mut() {
            Some((s, n)) if *s == sec => *n += 1,
            _ => r.push_back((sec, 1)),
        }
        while r.front().is_some_and(|(s, _)| s + RATE_WINDOW_S < sec) {
            r.pop_front();
        }
    }

    /// Generated tokens per second over the last [`RATE_WINDOW_S`] full seconds.
    pub fn tokens_per_second(&self) -> f64 {
        let elapsed = self.start.elapsed().as_secs_f64();
        let now = elapsed as u64;
        let r = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let n: u64 = r.iter().filter(|(s, _)| s + RATE_WINDOW_S > now).map(|(_, n)| n).sum();
        n as f64 / elapsed.clamp(1e-3, RATE_WINDOW_S as f64)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, v: String| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        let secs = |us: &AtomicU64| format!("{}", us.load(Relaxed) as f64 / 1e6);
        let (evaluated, cached) = (self.prompt_tokens.load(Relaxed), self.cached_prompt_tokens.load(Relaxed));
        let (lookups, hits) = (self.prompt_cache_lookups.load(Relaxed), self.prompt_cache_hits.load(Relaxed));
        let ratio = |a: u64, b: u64| format!("{:.4}", if b == 0 { 0.0 } else { a as f64 / b as f64 });
        metric("lode_prompt_tokens_total", "counter", "Prompt tokens evaluated.", evaluated.to_string());
        metric(
            "lode_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from the prompt cache instead of evaluated: the slot's own KV or copied from another sequence's (the timings' cache_n).",
            cached.to_string(),
        );
        metric(
            "lode_prompt_tokens_shared_total",
            "counter",
            "Of those, prompt tokens copied from another sequence's KV cache (n > 1, shared prefixes).",
            self.shared_prompt_tokens.load(Relaxed).to_string(),
        );
        metric("lode_prompt_cache_requests_total", "counter", "Requests that looked in the prompt cache (cache_prompt on).", lookups.to_string());
        metric("lode_prompt_cache_hits_total", "counter", "Of those, requests that reused at least one cached prompt token.", hits.to_string());
        metric("lode_prompt_cache_hit_rate", "gauge", "Prompt cache hits per request looked up, since start.", ratio(hits, lookups));
        metric(
            "lode_prompt_cache_token_rate",
            "gauge",
            "Prompt tokens reused per prompt token (reused + evaluated), since start.",
            ratio(cached, cached + evaluated),
        );
        metric("lode_generated_tokens_total", "counter", "Tokens generated.", self.generated_tokens.load(Relaxed).to_string());
        metric("lode_spec_verify_passes_total", "counter", "Speculative verify chunks run.", self.spec_passes.load(Relaxed).to_string());
        metric("lode_spec_drafted_tokens_total", "counter", "Drafted tokens checked by verify chunks.", self.spec_drafted.load(Relaxed).to_string());
        metric("lode_spec_accepted_tokens_total", "counter", "Drafted tokens the target accepted.", self.spec_accepted.load(Relaxed).to_string());
        metric("lode_spec_draft_batches_total", "counter", "Drafting rounds of the draft model or the MTP block (--model-draft, --spec-type draft-mtp).", self.draft_batches.load(Relaxed).to_string());
        metric("lode_spec_draft_requests_total", "counter", "Slots' draft requests those rounds served together.", self.draft_requests.load(Relaxed).to_string());
        metric("lode_prompt_seconds_total", "counter", "Time spent evaluating prompts.", secs(&self.prompt_us));
        metric("lode_decode_seconds_total", "counter", "Time spent generating.", secs(&self.decode_us));
        metric(
            "lode_generated_tokens_per_second",
            "gauge",
            "Generated tokens per second, all slots, over the last 10 s.",
            format!("{:.3}", self.tokens_per_second()),
        );
        metric("lode_requests_cancelled_total", "counter", "Requests whose client went away.", self.cancelled.load(Relaxed).to_string());
        metric("lode_worker_panics_total", "counter", "Panics caught in slot workers.", self.worker_panics.load(Relaxed).to_string());
        metric("lode_queue_depth", "gauge", "Requests waiting for a slot.", self.queue_depth.load(Relaxed).to_string());
        metric("lode_slots_active", "gauge", "Slots generating now.", self.active_slots.load(Relaxed).to_string());
        metric("lode_slots_total", "gauge", "Slots (--parallel).", self.slots.to_string());
        metric(
            "lode_device_memory_bytes",
            "gauge",
            "Device memory held by the backends (0 on the CPU).",
            self.device_memory_bytes.load(Relaxed).to_string(),
        );
        metric(
            "lode_weight_copies",
            "gauge",
            "Weight tensors copied into device memory by the weight cache (one per tensor used; 0 where weights are read from the mapped file).",
            self.weight_copies.load(Relaxed).to_string(),
        );
        metric(
            "lode_batch_steps_total",
            "counter",
            "Decode steps run, each one forward pass over the next token of every decoding request.",
            self.batch_steps.load(Relaxed).to_string(),
        );
        metric(
            "lode_batch_rows_total",
            "counter",
            "Sequences carried by those steps (divided by the steps: the mean batch size).",
            self.batch_rows.load(Relaxed).to_string(),
        );
        metric("lode_prefill_chunks_total", "counter", "Prompt chunks evaluated (chunked prefill: at most --ubatch-size rows a pass).", self.prefill_chunks.load(Relaxed).to_string());
        metric(
            "lode_prefill_chunks_mixed_total",
            "counter",
            "Of those, chunks carried by a decode step (one forward pass with the decoding streams' next tokens).",
            self.prefill_chunks_mixed.load(Relaxed).to_string(),
        );
        let _ = writeln!(
            o,
            "# HELP lode_decode_prefill_wait_seconds Decode steps that waited for a prompt chunk (one in their forward pass, or one evaluated alone while they waited): time from the step's ask to its logits.\n# TYPE lode_decode_prefill_wait_seconds summary\nlode_decode_prefill_wait_seconds_sum {}\nlode_decode_prefill_wait_seconds_count {}",
            secs(&self.prefill_wait_us),
            self.prefill_waits.load(Relaxed)
        );
        let mut metric = |name: &str, kind: &str, help: &str, v: String| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        metric("lode_decode_prefill_wait_seconds_max", "gauge", "The longest of those waits since start.", secs(&self.prefill_wait_max_us));
        let g = &self.grammar;
        metric("lode_grammar_masks_total", "counter", "Token masks computed for structured output.", g.masks.load(Relaxed).to_string());
        metric(
            "lode_grammar_mask_seconds_total",
            "counter",
            "Time the grammar threads spent computing token masks (overlapped with the forward pass).",
            secs(&g.mask_us),
        );
        metric(
            "lode_grammar_wait_seconds_total",
            "counter",
            "Time sampling waited for a token mask (the part not overlapped).",
            secs(&g.wait_us),
        );
        if let Some(rss) = resident_bytes() {
            metric("lode_process_resident_memory_bytes", "gauge", "Resident set size (VmRSS).", rss.to_string());
        }
        let _ = writeln!(
            o,
            "# HELP lode_requests_total HTTP requests by endpoint and status.\n# TYPE lode_requests_total counter"
        );
        let m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        for ((ep, status), n) in m.iter() {
            let _ = writeln!(o, "lode_requests_total{{endpoint=\"{ep}\",status=\"{status}\"}} {n}");
        }
        o
    }
}

/// This process's resident set size from `/proc/self/status` (Linux).
pub fn resident_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_lists_counters_and_labels() {
        let m = Metrics::new(2);
        m.request("/v1/completions", 200);
        m.request("/v1/completions", 200);
        m.request("/v1/chat/completions", 400);
        for _ in 0..5 {
            m.token();
        }
        m.generated_tokens.fetch_add(5, Relaxed);
        let t = m.render();
        assert!(t.contains("lode_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2"), "{t}");
        assert!(t.contains("lode_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1"));
        assert!(t.contains("lode_generated_tokens_total 5"));
        assert!(t.contains("lode_slots_total 2"));
        assert!(m.tokens_per_second() > 0.0);
        m.prefill_wait(std::time::Duration::from_millis(30));
        m.prefill_wait(std::time::Duration::from_millis(10));
        let t = m.render();
        assert!(t.contains("lode_decode_prefill_wait_seconds_count 2"), "{t}");
        assert!(t.contains("lode_decode_prefill_wait_seconds_sum 0.04\n"), "{t}");
        assert!(t.contains("lode_decode_prefill_wait_seconds_max 0.03\n"), "{t}");
    }
}
