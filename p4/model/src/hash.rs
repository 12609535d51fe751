//! The CRC-32 variants of SPEC §2: table-driven, reflected (LSB first), final XOR 0xFFFFFFFF,
//! differing in polynomial and initial value.

pub struct Crc32 {
    /// Slicing-by-8 tables: `tables[k][b]` is byte `b`'s contribution `k` bytes before the end
    /// of an 8-byte block, so a block costs 8 independent lookups instead of a chain of 8.
    tables: [[u32; 256]; 8],
    init: u32,
}

impl Crc32 {
    /// `poly` in its usual (MSB-first) form, e.g. 0x04C11DB7 for CRC-32.
    pub const fn new(poly: u32, init: u32) -> Crc32 {
        let reflected = poly.reverse_bits();
        let mut tables = [[0u32; 256]; 8];
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
            tables[0][i] = c;
            i += 1;
        }
        let mut k = 1;
        while k < 8 {
            let mut i = 0;
            while i < 256 {
                let prev = tables[k - 1][i];
                tables[k][i] = (prev >> 8) ^ tables[0][(prev & 0xff) as usize];
                i += 1;
            }
            k += 1;
        }
        Crc32 { tables, init }
    }

    pub fn hash(&self, bytes: &[u8]) -> u32 {
        let t = &self.tables;
        let mut c = self.init;
        let mut blocks = bytes.chunks_exact(8);
        for b in &mut blocks {
            let lo = c ^ u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            c = t[7][(lo & 0xff) as usize]
                ^ t[6][((lo >> 8) & 0xff) as usize]
                ^ t[5][((lo >> 16) & 0xff) as usize]
                ^ t[4][(lo >> 24) as usize]
                ^ t[3][b[4] as usize]
                ^ t[2][b[5] as usize]
                ^ t[1][b[6] as usize]
                ^ t[0][b[7] as usize];
        }
        for b in blocks.remainder() {
            c = t[0][((c ^ u32::from(*b)) & 0xff) as usize] ^ (c >> 8);
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
    fn slicing_by_8_equals_the_bytewise_definition() {
        fn bitwise(poly: u32, init: u32, bytes: &[u8]) -> u32 {
            let mut c = init;
            for b in bytes {
                c ^= u32::from(*b);
                for _ in 0..8 {
                    c = if c & 1 != 0 {
                        (c >> 1) ^ poly.reverse_bits()
                    } else {
                        c >> 1
                    };
                }
            }
            c ^ 0xffff_ffff
        }
        let data: Vec<u8> = (0..64u32).map(|i| (i * 37 + 11) as u8).collect();
        for len in 0..data.len() {
            assert_eq!(
                CRC32Q.hash(&data[..len]),
                bitwise(0x8141_41AB, 0xffff_ffff, &data[..len])
            );
            assert_eq!(
                SIGNATURE.hash(&data[..len]),
                bitwise(0x04C1_1DB7, 0, &data[..len])
            );
        }
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
