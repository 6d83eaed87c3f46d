//! The `--save-logits` file: per scored position, the log-probabilities a later run
//! (another backend, another build) is compared against with `--kl-divergence-base`.
//!
//! Storing every log-probability would take `n_vocab × 2` bytes per position — 10 GB for
//! Gemma 3's 262,144-token vocabulary over the fixture text — so the file keeps the
//! `top_k` most probable tokens exactly (f32) and treats the rest as one "tail" bucket
//! whose mass is `1 − Σ top-k p`. The KL divergence computed from it
//! ([`super::compare`]) is exact over the top-k and merges the tail; by the log-sum
//! inequality this can only under-estimate the full-vocabulary KLD, by at most the
//! divergence *inside* a tail that typically holds well under 1 % of the mass.
//!
//! Layout (little-endian):
//! ```text
//! header, 40 bytes:
//!   magic      [u8; 8]  b"LODELGP1"
//!   n_vocab    u32
//!   top_k      u32      tokens kept per position
//!   n_ctx      u32      chunk length
//!   n_chunks   u32      chunks evaluated
//!   n_tokens   u64      tokens of the whole tokenized text
//!   tokens_fnv u64      FNV-1a 64 of those token ids (u32 LE) — detects another text or tokenizer
//! then one record per scored position, chunk by chunk, position by position
//! (n_chunks × (n_ctx − 1 − n_ctx/2) records), each 8 + 8·top_k bytes:
//!   next_token u32      the token being predicted
//!   logp_next  f32      its log-probability
//!   top_k ×   (id u32, logp f32), most probable first (ties: lower id first)
//! ```

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};

pub const MAGIC: &[u8; 8] = b"LODELGP1";
const HEADER_BYTES: u64 = 40;

/// The file's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub n_vocab: u32,
    pub top_k: u32,
    pub n_ctx: u32,
    pub n_chunks: u32,
    pub n_tokens: u64,
    pub tokens_fnv: u64,
}

impl Header {
    /// Scored positions per chunk (llama-perplexity: positions n_ctx/2 .. n_ctx−2).
    pub fn scored_per_chunk(&self) -> u64 {
        scored_per_chunk(self.n_ctx as usize) as u64
    }
    fn record_bytes(&self) -> u64 {
        8 + 8 * self.top_k as u64
    }
}

pub fn scored_per_chunk(n_ctx: usize) -> usize {
    n_ctx - 1 - n_ctx / 2
}

/// One scored position.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub next_token: u32,
    pub logp_next: f32,
    /// `(id, log p)`, most probable first.
    pub top: Vec<(u32, f32)>,
}

/// FNV-1a 64 over the token ids as little-endian u32.
pub fn tokens_fnv(tokens: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in tokens {
        for b in t.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

pub struct LogitsWriter {
    out: BufWriter<File>,
    header: Header,
    written: u64,
    path: String,
}

impl LogitsWriter {
    pub fn create(path: &Path, header: Header) -> Result<LogitsWriter> {
        let f = File::create(path).with_context(|| format!("cannot create logits file {}", path.display()))?;
        let mut out = BufWriter::with_capacity(1 << 20, f);
        out.write_all(MAGIC)?;
        for v in [header.n_vocab, header.top_k, header.n_ctx, header.n_chunks] {
            out.write_all(&v.to_le_bytes())?;
        }
        out.write_all(&header.n_tokens.to_le_bytes())?;
        out.write_all(&header.tokens_fnv.to_le_bytes())?;
        Ok(LogitsWriter { out, header, written: 0, path: path.display().to_string() })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn write(&mut self, r: &Record) -> Result<()> {
        if r.top.len() != self.header.top_k as usize {
            bail!("logits record has {} top entries, header says {}", r.top.len(), self.header.top_k);
        }
        let mut buf = Vec::with_capacity(self.header.record_bytes() as usize);
        buf.extend_from_slice(&r.next_token.to_le_bytes());
        buf.extend_from_slice(&r.logp_next.to_le_bytes());
        for &(id, lp) in &r.top {
            buf.extend_from_slice(&id.to_le_bytes());
            buf.extend_from_slice(&lp.to_le_bytes());
        }
        self.out.write_all(&buf).with_context(|| format!("cannot write {}", self.path))?;
        self.written += 1;
        Ok(())
    }

    /// Flushes; the record count must match the header (a run cut short leaves the
    /// header claiming more chunks, so fix the count up front instead: the caller
    /// writes the header with the chunks it will run).
    pub fn finish(mut self) -> Result<()> {
        let expect = self.header.n_chunks as u64 * self.header.scored_per_chunk();
        if self.written != expect {
            bail!("wrote {} logits records to {}, expected {expect}", self.written, self.path);
        }
        self.out.flush().with_context(|| format!("cannot write {}", self.path))?;
        Ok(())
    }
}

pub struct LogitsReader {
    inp: BufReader<File>,
    pub header: Header,
    buf: Vec<u8>,
    path: String,
}

impl LogitsReader {
    pub fn open(path: &Path) -> Result<LogitsReader> {
        let name = path.display().to_string();
        let f = File::open(path).with_context(|| format!("cannot open logits file {name}"))?;
        let len = f.metadata()?.len();
        let mut inp = BufReader::with_capacity(1 << 20, f);
        let mut h = [0u8; HEADER_BYTES as usize];
        inp.read_exact(&mut h)
            .with_context(|| format!("{name}: too short for a lode logits file ({len} bytes)"))?;
        if &h[0..8] != MAGIC {
            bail!("{name} is not a lode logits file (magic {:?}, expected {:?})", &h[0..8], MAGIC);
        }
        let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().expect("8 bytes"));
        let header = Header {
            n_vocab: u32_at(8),
            top_k: u32_at(12),
            n_ctx: u32_at(16),
            n_chunks: u32_at(20),
            n_tokens: u64_at(24),
            tokens_fnv: u64_at(32),
        };
        if header.top_k == 0 || header.top_k > header.n_vocab || header.n_ctx < 4 {
            bail!("{name}: bad header (top_k {}, n_vocab {}, n_ctx {})", header.top_k, header.n_vocab, header.n_ctx);
        }
        let expect = HEADER_BYTES + header.n_chunks as u64 * header.scored_per_chunk() * header.record_bytes();
        if len != expect {
            bail!(
                "{name}: {len} bytes, but its header ({} chunks of {} tokens, top {}) needs {expect}",
                header.n_chunks,
                header.n_ctx,
                header.top_k
            );
        }
        let buf = vec![0u8; header.record_bytes() as usize];
        Ok(LogitsReader { inp, header, buf, path: name })
    }

    pub fn next_record(&mut self) -> Result<Record> {
        self.inp.read_exact(&mut self.buf).with_context(|| format!("{}: truncated record", self.path))?;
        let b = &self.buf;
        let u = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let f = |o: usize| f32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let top = (0..self.header.top_k as usize).map(|i| (u(8 + 8 * i), f(12 + 8 * i))).collect();
        let r = Record { next_token: u(0), logp_next: f(4), top };
        if r.next_token >= self.header.n_vocab || r.top.iter().any(|&(id, _)| id >= self.header.n_vocab) {
            bail!("{}: token id out of the vocabulary ({}) in a record", self.path, self.header.n_vocab);
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let dir = std::env::temp_dir().join(format!("lode-lgp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.bin");
        let h = Header { n_vocab: 10, top_k: 2, n_ctx: 4, n_chunks: 2, n_tokens: 9, tokens_fnv: tokens_fnv(&[1, 2]) };
        let recs: Vec<Record> = (0..2 * scored_per_chunk(4))
            .map(|i| Record { next_token: i as u32, logp_next: -(i as f32), top: vec![(3, -0.5), (i as u32, -1.5)] })
            .collect();
        let mut w = LogitsWriter::create(&p, h).unwrap();
        for r in &recs {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
        let mut rd = LogitsReader::open(&p).unwrap();
        assert_eq!(rd.header, h);
        for r in &recs {
            assert_eq!(&rd.next_record().unwrap(), r);
        }
        // Truncated file: a clear error.
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        let e = LogitsReader::open(&p).err().unwrap().to_string();
        assert!(e.contains("needs"), "{e}");
        std::fs::write(&p, b"not a logits file at all, clearly not one").unwrap();
        assert!(LogitsReader::open(&p).err().unwrap().to_string().contains("not a lode logits file"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn fnv_depends_on_order() {
        assert_ne!(tokens_fnv(&[1, 2]), tokens_fnv(&[2, 1]));
    }
}
