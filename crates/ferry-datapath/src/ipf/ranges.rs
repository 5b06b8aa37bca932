//! The byte ranges of a datagram that fragments have filled, in arrival order.
//!
//! Ranges are kept as received, never merged: an exact duplicate must match one range
//! exactly, and a different split of the same bytes is an overlap (RFC 5722). Most
//! datagrams have a handful of fragments, so the first few ranges live inline and only
//! larger datagrams spill to the heap.

const INLINE: usize = 6;

/// A half-open range `[start, end)` of datagram data offsets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Range {
    pub start: u32,
    pub end: u32,
}

/// A small vector of ranges.
#[derive(Debug, Default)]
pub(super) struct Ranges {
    len: usize,
    inline: [Range; INLINE],
    spill: Vec<Range>,
}

/// How a new range relates to the ranges held.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Fit {
    /// Disjoint from every held range.
    Free,
    /// Exactly equal to a held range.
    Same,
    /// Overlaps a held range partially or in a different split.
    Overlap,
}

impl Ranges {
    pub fn as_slice(&self) -> &[Range] {
        if self.spill.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spill
        }
    }

    /// Number of ranges, which is the number of fragments held.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn fit(&self, r: Range) -> Fit {
        for h in self.as_slice() {
            if h.start < r.end && r.start < h.end {
                return if *h == r { Fit::Same } else { Fit::Overlap };
            }
        }
        Fit::Free
    }

    pub fn push(&mut self, r: Range) {
        if self.spill.is_empty() && self.len < INLINE {
            self.inline[self.len] = r;
            self.len += 1;
            return;
        }
        if self.spill.is_empty() {
            self.spill.reserve(INLINE * 2);
            self.spill.extend_from_slice(&self.inline[..self.len]);
        }
        self.spill.push(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u32, end: u32) -> Range {
        Range { start, end }
    }

    #[test]
    fn test_fit_free_same_overlap() {
        let mut rs = Ranges::default();
        rs.push(r(0, 8));
        rs.push(r(16, 24));
        assert_eq!(rs.fit(r(8, 16)), Fit::Free);
        assert_eq!(rs.fit(r(16, 24)), Fit::Same);
        assert_eq!(rs.fit(r(0, 16)), Fit::Overlap);
        assert_eq!(rs.fit(r(20, 32)), Fit::Overlap);
    }

    #[test]
    fn test_spills_past_inline_capacity() {
        let mut rs = Ranges::default();
        for i in 0..20 {
            rs.push(r(i * 8, i * 8 + 8));
        }
        assert_eq!(rs.len(), 20);
        assert_eq!(rs.as_slice()[0], r(0, 8));
        assert_eq!(rs.as_slice()[19], r(152, 160));
        assert_eq!(rs.fit(r(152, 160)), Fit::Same);
        assert_eq!(rs.fit(r(160, 168)), Fit::Free);
    }
}
