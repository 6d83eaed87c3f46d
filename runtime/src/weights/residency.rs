//! Where weights live on a GPU (DESIGN decision 5): `device`, `mapped` or `upload`.
//!
//! Chosen by `--residency`, else by the device: a GPU that shares system memory (integrated / unified, e.g. gfx1151) reads
//! the file mapping in place (`mapped`); a discrete GPU makes one device copy per weight
//! on first use (`device`). `upload` copies every weight at load, as llama.cpp does, to
//! bisect regressions. The CPU reads the mapping in place whatever the mode says.

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Residency {
    /// One device copy per weight, made on first use from the mapping.
    Device,
    /// The mapping is registered with the GPU (read-only); stored-layout weights are read
    /// in place over the bus or from shared memory: zero device copies for them.
    Mapped,
    /// Every weight is materialized at load.
    Upload,
}

impl FromStr for Residency {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "device" => Ok(Residency::Device),
            "mapped" => Ok(Residency::Mapped),
            "upload" => Ok(Residency::Upload),
            _ => Err(format!("unknown residency `{s}` (expected device, mapped or upload)")),
        }
    }
}

impl fmt::Display for Residency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Residency::Device => "device",
            Residency::Mapped => "mapped",
            Residency::Upload => "upload",
        })
    }
}

impl Residency {
    /// The default for a device: unified memory → `mapped`, else `device`.
    pub fn default_for(unified_memory: bool) -> Residency {
        if unified_memory {
            Residency::Mapped
        } else {
            Residency::Device
        }
    }

    /// The mode to use: the flag, else the device's default.
    pub fn resolve(flag: Option<Residency>, unified_memory: bool) -> Result<Residency, String> {
        Ok(flag.unwrap_or_else(|| Residency::default_for(unified_memory)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_defaults() {
        assert_eq!("Mapped".parse::<Residency>(), Ok(Residency::Mapped));
        assert!("gpu".parse::<Residency>().unwrap_err().contains("device, mapped or upload"));
        assert_eq!(Residency::default_for(true), Residency::Mapped);
        assert_eq!(Residency::default_for(false), Residency::Device);
        assert_eq!(Residency::resolve(Some(Residency::Upload), true), Ok(Residency::Upload));
        assert_eq!(Residency::resolve(None, false), Ok(Residency::Device));
        assert_eq!(Residency::Upload.to_string(), "upload");
    }
}
