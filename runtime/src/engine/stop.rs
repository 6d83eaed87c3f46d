//! Stop strings over streamed text: text that could still be the start of a stop
//! string is held back, so a stop string is never half printed.

/// Watches streamed text for any of a set of stop strings.
#[derive(Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    pending: String,
}

impl StopStrings {
    pub fn new(stops: Vec<String>) -> StopStrings {
        StopStrings { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), pending: String::new() }
    }

    /// Adds `piece`; returns the text that is safe to emit now and whether a stop string
    /// was completed (the stop string and anything after it are dropped).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.pending.push_str(piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Hold back the longest suffix that is a prefix of some stop string.
        let hold = self
            .pending
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&self.pending[i..])))
            .unwrap_or(self.pending.len());
        let out = self.pending[..hold].to_string();
        self.pending.drain(..hold);
        (out, false)
    }

    /// The held-back text, at the end of generation.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_partial_match_and_stops_on_full_match() {
        let mut s = StopStrings::new(vec!["\nUser:".into()]);
        assert_eq!(s.push("Hello"), ("Hello".into(), false));
        assert_eq!(s.push(" there\nUs"), (" there".into(), false));
        assert_eq!(s.push("er: hi"), ("".into(), true));
    }

    #[test]
    fn false_alarm_is_released() {
        let mut s = StopStrings::new(vec!["STOP".into()]);
        assert_eq!(s.push("ST"), ("".into(), false));
        assert_eq!(s.push("ART é"), ("START é".into(), false));
        assert_eq!(s.push("ST"), ("".into(), false));
        assert_eq!(s.flush(), "ST");
    }
}
