//! Constrained sampling: a [`Constraint`] says which tokens may come next (a
//! [`TokenMask`]) and hears which one was chosen. The [`super::Sampler`] asks for the
//! mask before each draw and gives every token outside it a logit of −∞, so a grammar
//! or a JSON schema shapes the output token by token. The engine knows no grammar: the
//! server implements the trait (over llguidance), and anything else may.

/// The set of token ids allowed at one step: a bit per id, 32 ids a word (bit `i % 32`
/// of word `i / 32`, the layout llguidance's `SimpleVob` uses). Ids past the end
/// (a model whose logits are wider than its vocabulary) are not allowed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
}

impl TokenMask {
    /// No token allowed, room for ids `0..n`.
    pub fn none(n: usize) -> TokenMask {
        TokenMask { words: vec![0; n.div_ceil(32)] }
    }

    /// From the bit words (see the type's layout).
    pub fn from_words(words: Vec<u32>) -> TokenMask {
        TokenMask { words }
    }

    /// The bit words.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    pub fn allows(&self, id: u32) -> bool {
        let i = id as usize;
        self.words.get(i / 32).is_some_and(|w| w >> (i % 32) & 1 != 0)
    }

    /// Allows (`true`) or forbids one id; an id past the end grows the mask.
    pub fn set(&mut self, id: u32, allowed: bool) {
        let i = id as usize;
        if i / 32 >= self.words.len() {
            if !allowed {
                return;
            }
            self.words.resize(i / 32 + 1, 0);
        }
        if allowed {
            self.words[i / 32] |= 1 << (i % 32);
        } else {
            self.words[i / 32] &= !(1 << (i % 32));
        }
    }

    /// How many ids are allowed.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Sets every forbidden token's logit to −∞ (`logits[i]` is token `i`'s).
    pub fn apply(&self, logits: &mut [f32]) {
        for (k, chunk) in logits.chunks_mut(32).enumerate() {
            match self.words.get(k).copied().unwrap_or(0) {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                w => {
                    for (b, l) in chunk.iter_mut().enumerate() {
                        if w >> b & 1 == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
    }
}

/// What constrains a generation (a grammar, a JSON schema). The sampler calls
/// [`Constraint::allowed`] once before each token and [`Constraint::commit`] with the
/// token it drew; an implementation may compute the next mask in the background
/// between the two (while the model evaluates the token).
pub trait Constraint: Send {
    /// The tokens allowed next. End-of-generation tokens are in it only where the
    /// constraint may end. Never empty: an implementation that fails allows only the
    /// end-of-generation tokens (and reports its error its own way).
    fn allowed(&mut self) -> TokenMask;
    /// The token that was drawn (always one of [`Constraint::allowed`]'s).
    fn commit(&mut self, token: u32);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_bits_and_apply() {
        let mut m = TokenMask::none(70);
        assert_eq!(m.words().len(), 3);
        for id in [0, 33, 69] {
            m.set(id, true);
        }
        assert!(m.allows(0) && m.allows(33) && m.allows(69));
        assert!(!m.allows(1) && !m.allows(32) && !m.allows(70) && !m.allows(10_000));
        assert_eq!(m.count(), 3);
        m.set(33, false);
        m.set(5000, false); // past the end, forbidding: nothing changes
        assert_eq!(m.words().len(), 3);
        let mut logits: Vec<f32> = (0..72).map(|i| i as f32).collect();
        m.apply(&mut logits);
        assert_eq!(logits[0], 0.0);
        assert_eq!(logits[69], 69.0);
        assert_eq!(logits.iter().filter(|l| l.is_finite()).count(), 2);
        assert_eq!(logits[33], f32::NEG_INFINITY);
        assert_eq!(logits[71], f32::NEG_INFINITY, "ids past the mask are forbidden");
    }
}
