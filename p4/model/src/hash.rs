//! The CRC-32 variants of SPEC §2: table-driven, reflected (LSB first), final XOR 0xFFFFFFFF,
//! differing in polynomial and initial value.

pub struct Crc32 {
    table: [u32; 256],
    init: u32,
}

impl Crc32 {
    /// `poly` in its usual (MSB-first) form, e.g. 0x04C11DB7 for CRC-32.
    pub const fn new(poly: u32, init: u32) -> Crc32 {
        let reflected = poly.reverse_bits();
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut bit = 0;
            while bit < 8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ reflected
                } else {
                    c >> 1
                };
                bit += 1;
            }
            table[i] = c;
            i += 1;
        }
        Crc32 { table, init }
    }

    pub fn hash(&self, bytes: &[u8]) -> u32 {
        let mut c = self.init;
        for b in bytes {
            c = self.table[((c ^ u32::from(*b)) & 0xff) as usize] ^ (c >> 8);
        }
        c ^ 0xffff_ffff
    }
}

pub const CRC32: Crc32 = Crc32::new(0x04C1_1DB7, 0xffff_ffff);
pub const CRC32C: Crc32 = Crc32::new(0x1EDC_6F41, 0xffff_ffff);
pub const CRC32D: Crc32 = Crc32::new(0xA833_982B, 0xffff_ffff);
pub const CRC32Q: Crc32 = Crc32::new(0x8141_41AB, 0xffff_ffff);
/// Signatures: CRC-32 started from 0, independent of every index hash.
pub const SIGNATURE: Crc32 = Crc32::new(0x04C1_1DB7, 0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_check_values() {
        // The catalogue's check value of each algorithm over "123456789".
        assert_eq!(CRC32.hash(b"123456789"), 0xCBF4_3926);
        assert_eq!(CRC32C.hash(b"123456789"), 0xE306_9283);
        assert_eq!(CRC32D.hash(b"123456789"), 0x8731_5576);
    }

    #[test]
    fn signatures_differ_from_index_hashes() {
        let key = b"\x0a\xc9\x01\x0a\x0a\xc9\x02\x02\x9c\x40\x14\x51\x06";
        let all = [
            CRC32.hash(key),
            CRC32C.hash(key),
            CRC32D.hash(key),
            CRC32Q.hash(key),
        ];
        assert!(!all.contains(&SIGNATURE.hash(key)));
    }
}
