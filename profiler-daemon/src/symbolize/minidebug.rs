//! MiniDebugInfo: the xz-compressed ELF in a stripped file's `.gnu_debugdata` section that
//! Fedora, RHEL and their derivatives ship in every binary, holding the symbol table of the
//! functions the dynamic symbol table lacks (gdb's "MiniDebugInfo").
//!
//! blazesym reads it (its `xz` feature: liblzma through `xz2`) when a file has no `.symtab`,
//! but inflates it whole, with no bound: a file any user can map may hold an xz bomb. So the
//! stream is first inflated here into nothing, counting up to a cap, and a file whose
//! section is over the cap or corrupt is not given to blazesym at all (its addresses stay
//! `file+offset`, with a note saying why). The section is small (100-400 KiB inflated for a
//! distribution's shell or libc), so inflating it twice costs little.

use std::io::Read;

/// The most a `.gnu_debugdata` may inflate to: a symbol table of a very large program
/// (the biggest Fedora ships are a few MiB).
pub const MAX_MINIDEBUG_BYTES: u64 = 64 << 20;

/// Whether the MiniDebugInfo `section` (raw, xz) may be read: `Err` says why not.
pub fn check(section: &[u8], cap: u64) -> Result<u64, String> {
    let mut decoder = xz2::read::XzDecoder::new(section).take(cap + 1);
    let mut inflated = 0u64;
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        match decoder.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => inflated += n as u64,
            Err(err) => return Err(format!("its .gnu_debugdata is not a valid xz stream ({err})")),
        }
    }
    if inflated > cap {
        return Err(format!("its .gnu_debugdata inflates to over {cap} bytes"));
    }
    Ok(inflated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn xz(bytes: &[u8]) -> Vec<u8> {
        let mut enc = xz2::write::XzEncoder::new(Vec::new(), 6);
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn inflates_within_the_cap_and_refuses_bombs_and_garbage() {
        assert_eq!(check(&xz(b"\x7fELF and more"), 1024), Ok(13));
        // 16 MiB of zeros is a few KiB of xz: refused at a 1 MiB cap without inflating it all.
        let bomb = xz(&vec![0u8; 16 << 20]);
        assert!(bomb.len() < 64 << 10);
        assert!(check(&bomb, 1 << 20).unwrap_err().contains("over"));
        assert!(check(b"not xz at all", 1 << 20).unwrap_err().contains("not a valid xz"));
    }
}
