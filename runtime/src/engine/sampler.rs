//! The sampler chain, in llama.cpp's default order: repetition / presence / frequency
//! penalties → top-k → top-p → min-p → temperature → draw. Temperature ≤ 0 is greedy
//! (argmax after penalties, ties to the lowest id). The draw uses a seeded xoshiro256**
//! generator, so a seed gives the same tokens every run. With a [`Constraint`] (a
//! grammar, a JSON schema), every token outside its mask gets a logit of −∞ after the
//! penalties, before top-k: only allowed tokens can be drawn, greedy or not.

use std::collections::{HashMap, VecDeque};

use super::constraint::{Constraint, TokenMask};

/// Sampling settings (llama.cpp's defaults).
#[derive(Clone, Debug)]
pub struct SamplerParams {
    pub temp: f32,
    /// 0: off.
    pub top_k: usize,
    /// 1.0: off.
    pub top_p: f32,
    /// 0.0: off.
    pub min_p: f32,
    /// 1.0: off.
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerParams {
    /// Plain argmax.
    pub fn greedy() -> Self {
        SamplerParams { temp: 0.0, ..Default::default() }
    }
}

/// A sampler with its history (for penalties), random state and optional constraint.
pub struct Sampler {
    pub params: SamplerParams,
    rng: Xoshiro,
    recent: VecDeque<u32>,
    constraint: Option<Box<dyn Constraint>>,
    /// The constraint's mask of the last draw.
    last_mask: Option<TokenMask>,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Sampler {
        let rng = Xoshiro::seeded(params.seed);
        Sampler { params, rng, recent: VecDeque::new(), constraint: None, last_mask: None }
    }

    /// Draws only the tokens `c` allows, and tells it each token drawn.
    pub fn with_constraint(mut self, c: Box<dyn Constraint>) -> Sampler {
        self.constraint = Some(c);
        self
    }

    /// Records a token the penalties should see (prompt tokens and sampled ones).
    pub fn accept(&mut self, tok: u32) {
        if self.params.penalty_last_n == 0 {
            return;
        }
        if self.recent.len() == self.params.penalty_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(tok);
    }

    /// Picks the next token from `logits` (`[n_vocab]`), within the constraint's mask
    /// when there is one (and commits the token to it). Does not call [`Self::accept`].
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let mask = self.constraint.as_mut().map(|c| c.allowed());
        let tok = self.draw(logits, mask.as_ref());
        if let Some(c) = self.constraint.as_mut() {
            c.commit(tok);
        }
        self.last_mask = mask;
        tok
    }

    /// The mask the constraint gave the last [`Self::sample`] (`None` without one): the
    /// tokens that draw could pick, for log-probabilities of the constrained distribution.
    pub fn last_mask(&self) -> Option<&TokenMask> {
        self.last_mask.as_ref()
    }

    fn draw(&mut self, logits: &[f32], mask: Option<&TokenMask>) -> u32 {
        match self.dist(logits, mask) {
            Dist::Greedy(t) => t,
            Dist::Probs(d) => self.pick(&d),
        }
    }

    /// Whether a [`Constraint`] limits the draws (speculative decoding refuses one: a
    /// constraint cannot be rolled back past a rejected draft).
    pub fn has_constraint(&self) -> bool {
        self.constraint.is_some()
    }

    /// The distribution [`Self::sample`] would draw the next token from, without a
    /// constraint: `(token, probability)` after the penalties, top-k, top-p, min-p and
    /// temperature, most likely first; greedy is one token of probability 1.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f64)> {
        match self.dist(logits, None) {
            Dist::Greedy(t) => vec![(t, 1.0)],
            Dist::Probs(d) => d,
        }
    }

    /// Draws from `dist` (as made by [`Self::distribution`]) with this sampler's random
    /// state: one uniform number, as [`Self::sample`] uses.
    pub fn pick(&mut self, dist: &[(u32, f64)]) -> u32 {
        let u = self.rng.next_f64();
        pick_at(dist, u)
    }

    /// A uniform number in [0, 1) from this sampler's random state.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    fn dist(&self, logits: &[f32], mask: Option<&TokenMask>) -> Dist {
        let p = &self.params;
        let mut cand: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        self.apply_penalties(&mut cand);
        if let Some(m) = mask {
            mask_candidates(&mut cand, m);
        }
        if p.temp <= 0.0 {
            return Dist::Greedy(argmax(&cand));
        }
        // Sort descending (top-k first narrows the sort when set).
        let desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, desc);
            cand.truncate(p.top_k);
        }
        cand.sort_unstable_by(desc);
        // top-p over the softmax of the (untempered) logits.
        if p.top_p < 1.0 {
            let probs = softmax(&cand);
            let mut cum = 0.0;
            let mut keep = cand.len();
            for (i, pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 && !cand.is_empty() {
            let max = cand[0].1;
            let floor = max + (p.min_p as f64).ln() as f32;
            let keep = cand.iter().take_while(|c| c.1 >= floor).count();
            cand.truncate(keep.max(1));
        }
        for c in cand.iter_mut() {
            c.1 /= p.temp;
        }
        let probs = softmax(&cand);
        Dist::Probs(cand.iter().zip(probs).map(|(c, pr)| (c.0, pr)).collect())
    }

    fn apply_penalties(&self, cand: &mut [(u32, f32)]) {
        let p = &self.params;
        if self.recent.is_empty()
            || (p.repeat_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0)
        {
            return;
        }
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in &self.recent {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &n) in &counts {
            let Some(c) = cand.get_mut(t as usize) else { continue };
            if c.1 > 0.0 {
                c.1 /= p.repeat_penalty;
            } else {
                c.1 *= p.repeat_penalty;
            }
            c.1 -= n as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }
}

/// Drops every token the mask forbids from the candidates, as a logit of −∞ would
/// (probability 0 whatever the temperature, never the argmax). Should nothing be left
/// (a mask that allows only ids past the logits), the candidates stay as they were.
fn mask_candidates(cand: &mut Vec<(u32, f32)>, mask: &TokenMask) {
    if cand.iter().any(|c| mask.allows(c.0)) {
        cand.retain(|c| mask.allows(c.0));
    }
}

/// What a draw picks from: one token (greedy) or a distribution, most likely first.
enum Dist {
    Greedy(u32),
    Probs(Vec<(u32, f64)>),
}

/// The token of `dist` where the cumulative probability first exceeds `u` (the last one
/// should rounding leave `u` past the total).
pub(crate) fn pick_at(dist: &[(u32, f64)], u: f64) -> u32 {
    let mut cum = 0.0;
    for &(t, pr) in dist {
        cum += pr;
        if u < cum {
            return t;
        }
    }
    dist.last().map_or(0, |c| c.0)
}

/// Index of the largest logit, ties to the lowest id.
pub fn argmax_logits(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn argmax(cand: &[(u32, f32)]) -> u32 {
    let mut best = cand[0];
    for &c in cand {
        if c.1 > best.1 || (c.1 == best.1 && c.0 < best.0) {
            best = c;
        }
    }
    best.0
}

fn softmax(cand: &[(u32, f32)]) -> Vec<f64> {
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = cand.iter().map(|c| (c.1 as f64 - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// xoshiro256** seeded through splitmix64: small, fast, reproducible everywhere.
pub(crate) struct Xoshiro([u64; 4]);

impl Xoshiro {
    pub(crate) fn seeded(seed: u64) -> Xoshiro {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        };
        Xoshiro([next(), next(), next(), next()])
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1).
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.9, -1.0, 0.5, 3.0]
    }

    #[test]
    fn greedy_is_argmax_ties_to_lowest_id() {
        let mut s = Sampler::new(SamplerParams::greedy());
        assert_eq!(s.sample(&logits()), 1);
        assert_eq!(argmax_logits(&logits()), 1);
    }

    #[test]
    fn same_seed_same_tokens_and_top_k_limits_choices() {
        let params = SamplerParams { temp: 1.5, top_k: 2, top_p: 1.0, min_p: 0.0, seed: 42, ..Default::default() };
        let draw = |p: &SamplerParams| {
            let mut s = Sampler::new(p.clone());
            (0..200).map(|_| s.sample(&logits())).collect::<Vec<_>>()
        };
        let a = draw(&params);
        assert_eq!(a, draw(&params));
        assert!(a.iter().all(|&t| t == 1 || t == 5), "top-k 2 keeps ids 1 and 5");
        assert!(a.contains(&1) && a.contains(&5));
        let b = draw(&SamplerParams { seed: 43, ..params });
        assert_ne!(a, b);
    }

    #[test]
    fn min_p_and_top_p_cut_the_tail() {
        // min-p 0.5: keeps tokens with p >= 0.5 p_max: ids 1, 5, 2.
        let p = SamplerParams { temp: 1.0, top_k: 0, top_p: 1.0, min_p: 0.5, seed: 1, ..Default::default() };
        let mut s = Sampler::new(p);
        for _ in 0..300 {
            assert!([1, 2, 5].contains(&s.sample(&logits())));
        }
        let p = SamplerParams { temp: 1.0, top_k: 0, top_p: 0.3, min_p: 0.0, seed: 1, ..Default::default() };
        let mut s = Sampler::new(p);
        for _ in 0..300 {
            assert_eq!(s.sample(&logits()), 1, "top-p 0.3 keeps only the first of the two 3.0s");
        }
    }

    /// Allows a fixed set; records what it was told.
    struct Only(Vec<u32>, std::sync::Arc<std::sync::Mutex<Vec<u32>>>);

    impl Constraint for Only {
        fn allowed(&mut self) -> TokenMask {
            let mut m = TokenMask::none(6);
            self.0.iter().for_each(|&t| m.set(t, true));
            m
        }
        fn commit(&mut self, token: u32) {
            self.1.lock().unwrap().push(token);
        }
    }

    #[test]
    fn a_constraint_limits_every_draw_and_hears_each_token() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        // Greedy: the best allowed token (id 4, logit 0.5), not the global argmax.
        let mut s = Sampler::new(SamplerParams::greedy()).with_constraint(Box::new(Only(vec![0, 3, 4], seen.clone())));
        assert_eq!(s.sample(&logits()), 0);
        let mut s = Sampler::new(SamplerParams::greedy()).with_constraint(Box::new(Only(vec![3, 4], seen.clone())));
        assert_eq!(s.sample(&logits()), 4);
        // Sampling, hot and without top-k: only allowed ids come out, both of them.
        let p = SamplerParams { temp: 5.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 9, ..Default::default() };
        let mut s = Sampler::new(p).with_constraint(Box::new(Only(vec![2, 3], seen.clone())));
        let drawn: Vec<u32> = (0..300).map(|_| s.sample(&logits())).collect();
        assert!(drawn.iter().all(|&t| t == 2 || t == 3));
        assert!(drawn.contains(&2) && drawn.contains(&3));
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 302);
        assert_eq!(&seen[..2], &[0, 4]);
        assert_eq!(&seen[2..], &drawn[..], "the constraint hears every token drawn");
    }

    #[test]
    fn repetition_penalty_moves_greedy_choice() {
        let mut s = Sampler::new(SamplerParams { repeat_penalty: 1.5, ..SamplerParams::greedy() });
        s.accept(1);
        s.accept(5);
        assert_eq!(s.sample(&logits()), 2);
        let mut s = Sampler::new(SamplerParams { presence_penalty: 0.5, ..SamplerParams::greedy() });
        s.accept(1);
        assert_eq!(s.sample(&logits()), 5);
    }
}
