//! The row64 layouts for Q4_K and Q6_K (reference §4.3): the GPU decode/prefill kernels'
//! canonical device layout. Lossless and the same size as the stored tensor.
//!
//! A weight of `rows` rows × `k` elements is cut into groups of 64 rows and, inside a
//! group, into K-blocks of 256; each (group g, K-block b) pair is one contiguous tile at
//! `(g·n_kblocks + b) · 64 · block_bytes`. Inside a tile every field is stored for all
//! 64 rows ("lanes") before the next field, so 64 lanes reading one field read one span.
//!
//! * `q4k-i4-k32-row64` (144 B per lane): field 0 = the block's first 16 bytes (`d`,
//!   `dmin`, `scales[12]`) unchanged; fields 1..=8 = sub-block j's 32 codes in element
//!   order, byte p = element 2p (low nibble) | element 2p+1 (high nibble). Field f of lane
//!   r is at `tile + f·1024 + r·16`.
//! * `q6k-packed-k256-row64` (210 B per lane), default scale plane: d-plane (64 × f16),
//!   scale-plane `[group 8][lane 64][2 × i8]` (scales 2g, 2g+1), raw-plane: for half
//!   h = 0, 1 three 32-byte fields (`ql[64h..+32]`, `ql[64h+32..+32]`, `qh[32h..+32]`),
//!   field-major over the 64 lanes: `raw + ((3h + field)·64 + lane)·32`.
//!
//! **Shapes.** K is always a multiple of 256 for these types (a row is whole
//! super-blocks; anything else is [`QuantError::PartialBlock`]). When `rows` is not a
//! multiple of 64, the packed buffer is padded with zero-filled lanes up to the next
//! multiple of 64 ([`packed_len`] reports the padded size, at most 63 rows more than the
//! source); [`unpack`] drops the padding. A zero block decodes to zeros in both types, so
//! a kernel may read the padded lanes and simply not store their outputs.

use super::types::GgmlType;
use super::QuantError;

const LANES: usize = 64;

/// The layout name HRX and lode use for `ty`'s row64 layout, or `None` if it has none.
pub fn layout_name(ty: GgmlType) -> Option<&'static str> {
    match ty {
        GgmlType::Q4_K => Some("q4k-i4-k32-row64"),
        GgmlType::Q6_K => Some("q6k-packed-k256-row64"),
        _ => None,
    }
}

/// Rows after padding to a multiple of 64.
pub fn padded_rows(rows: usize) -> usize {
    rows.div_ceil(LANES) * LANES
}

/// (K-blocks per row, bytes per block) after checking the type and shape.
fn geometry(ty: GgmlType, k: usize) -> Result<(usize, usize), QuantError> {
    if layout_name(ty).is_none() {
        return Err(QuantError::NoRow64(ty));
    }
    if k % 256 != 0 {
        return Err(QuantError::PartialBlock {
            ty,
            n: k,
            block: 256,
        });
    }
    Ok((k / 256, ty.block_bytes()))
}

/// Bytes of the packed form of a `rows × k` weight of type `ty` (rows padded to 64).
pub fn packed_len(ty: GgmlType, rows: usize, k: usize) -> Result<usize, QuantError> {
    let (nkb, bb) = geometry(ty, k)?;
    Ok(padded_rows(rows) * nkb * bb)
}

fn check(what: GgmlType, expected: usize, got: usize) -> Result<(), QuantError> {
    if expected != got {
        return Err(QuantError::ByteLen {
            ty: what,
            expected,
            got,
        });
    }
    Ok(())
}

/// Pack `src` (`rows` rows of `k` elements, stored layout) into `dst`
/// (`packed_len` bytes).
pub fn pack(
    ty: GgmlType,
    src: &[u8],
    rows: usize,
    k: usize,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    let (nkb, bb) = geometry(ty, k)?;
    check(ty, rows * nkb * bb, src.len())?;
    check(ty, padded_rows(rows) * nkb * bb, dst.len())?;
    let zero = vec![0u8; bb];
    for (t, tile) in dst.chunks_exact_mut(LANES * bb).enumerate() {
        let (g, b) = (t / nkb, t % nkb);
        for lane in 0..LANES {
            let row = g * LANES + lane;
            let blk = if row < rows {
                &src[(row * nkb + b) * bb..][..bb]
            } else {
                &zero[..]
            };
            match ty {
                GgmlType::Q4_K => pack_q4k(blk, tile, lane),
                _ => pack_q6k(blk, tile, lane),
            }
        }
    }
    Ok(())
}

/// Unpack `src` (`packed_len` bytes) back to the stored layout of `rows × k` in `dst`.
pub fn unpack(
    ty: GgmlType,
    src: &[u8],
    rows: usize,
    k: usize,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    let (nkb, bb) = geometry(ty, k)?;
    check(ty, padded_rows(rows) * nkb * bb, src.len())?;
    check(ty, rows * nkb * bb, dst.len())?;
    for (t, tile) in src.chunks_exact(LANES * bb).enumerate() {
        let (g, b) = (t / nkb, t % nkb);
        for lane in 0..LANES {
            let row = g * LANES + lane;
            if row >= rows {
                break;
            }
            let blk = &mut dst[(row * nkb + b) * bb..][..bb];
            match ty {
                GgmlType::Q4_K => unpack_q4k(tile, lane, blk),
                _ => unpack_q6k(tile, lane, blk),
            }
        }
    }
    Ok(())
}

// ---- Q4_K ----------------------------------------------------------------------------

/// Element e (0..32) of sub-block j lives in nibble (j mod 2) of `qs[32·(j/2) + e]`.
fn pack_q4k(blk: &[u8], tile: &mut [u8], lane: usize) {
    tile[lane * 16..lane * 16 + 16].copy_from_slice(&blk[..16]);
    let qs = &blk[16..144];
    for j in 0..8 {
        let f = &mut tile[(1 + j) * LANES * 16 + lane * 16..][..16];
        let nib = |e: usize| (qs[32 * (j / 2) + e] >> (4 * (j % 2))) & 15;
        for (p, o) in f.iter_mut().enumerate() {
            *o = nib(2 * p) | (nib(2 * p + 1) << 4);
        }
    }
}

fn unpack_q4k(tile: &[u8], lane: usize, blk: &mut [u8]) {
    blk[..16].copy_from_slice(&tile[lane * 16..lane * 16 + 16]);
    let qs = &mut blk[16..144];
    qs.fill(0);
    for j in 0..8 {
        let f = &tile[(1 + j) * LANES * 16 + lane * 16..][..16];
        for e in 0..32 {
            let v = (f[e / 2] >> (4 * (e % 2))) & 15;
            qs[32 * (j / 2) + e] |= v << (4 * (j % 2));
        }
    }
}

// ---- Q6_K ----------------------------------------------------------------------------

const Q6_D_PLANE: usize = LANES * 2;
const Q6_SCALE_PLANE: usize = LANES * 16;
const Q6_RAW: usize = Q6_D_PLANE + Q6_SCALE_PLANE;

/// (offset in the tile, offset in the block) of the six 32-byte raw fields of a lane.
fn q6_raw_fields(lane: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..2).flat_map(move |h| {
        let src = [64 * h, 64 * h + 32, 128 + 32 * h];
        (0..3).map(move |f| (Q6_RAW + ((h * 3 + f) * LANES + lane) * 32, src[f]))
    })
}

/// Scale s of a lane sits at `(s/2 · 64 + lane) · 2 + s mod 2` in the scale plane.
fn q6_scale_at(lane: usize, s: usize) -> usize {
    Q6_D_PLANE + ((s / 2) * LANES + lane) * 2 + s % 2
}

fn pack_q6k(blk: &[u8], tile: &mut [u8], lane: usize) {
    tile[lane * 2..lane * 2 + 2].copy_from_slice(&blk[208..210]);
    for s in 0..16 {
        tile[q6_scale_at(lane, s)] = blk[192 + s];
    }
    for (t, b) in q6_raw_fields(lane) {
        tile[t..t + 32].copy_from_slice(&blk[b..b + 32]);
    }
}

fn unpack_q6k(tile: &[u8], lane: usize, blk: &mut [u8]) {
    blk[208..210].copy_from_slice(&tile[lane * 2..lane * 2 + 2]);
    for s in 0..16 {
        blk[192 + s] = tile[q6_scale_at(lane, s)];
    }
    for (t, b) in q6_raw_fields(lane) {
        blk[b..b + 32].copy_from_slice(&tile[t..t + 32]);
    }
}
