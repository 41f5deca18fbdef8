//! Just enough of the ELF format to tell whether an x86-64 Linux executable is statically
//! linked: no program interpreter (`PT_INTERP`, the dynamic loader a dynamic binary names) and
//! no shared library it needs (`DT_NEEDED` entries of its dynamic section). A static-PIE binary
//! (what `+crt-static` on the gnu target makes) has a `PT_DYNAMIC` segment for its own
//! relocations, so the segment alone proves nothing: its entries are read.
//!
//! Read from the bytes, not from `file` or `ldd`: their wording differs between versions (and
//! `ldd` on a static-PIE says "statically linked" on some and runs the loader on others).
//!
//! A crate of its own because two readers must agree on what "static" means: xtask's agent build
//! (`xtask/src/agent_build.rs`) refuses a dynamic agent before it is shipped, and the Docker
//! adapter (`sandbox-provider-docker`, `src/agent/`) refuses one before it copies it into a
//! container, where a dynamic binary would find no loader. xtask builds this crate on every run,
//! so it has no dependencies (tidy rule `shared-with-xtask`).

/// `\x7fELF`.
const MAGIC: &[u8; 4] = b"\x7fELF";
const CLASS_64: u8 = 2;
const DATA_LITTLE_ENDIAN: u8 = 1;
const MACHINE_X86_64: u16 = 62;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
/// The size of one program header and one dynamic entry in ELF64.
const PHDR_SIZE: usize = 56;
const DYN_SIZE: usize = 16;

/// What the linking of an executable looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Linking {
    /// The program interpreter (`/lib64/ld-linux-x86-64.so.2`), when there is one.
    pub interpreter: Option<String>,
    /// The shared libraries the executable needs, by name (`libc.so.6`); a name that cannot be
    /// read is given as `?`.
    pub needed: Vec<String>,
}

impl Linking {
    pub fn is_static(&self) -> bool {
        self.interpreter.is_none() && self.needed.is_empty()
    }
}

/// One program header, the fields this module reads.
#[derive(Clone, Copy, Debug)]
struct Segment {
    kind: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The bytes of a segment's file image, bounds-checked.
fn segment_bytes(b: &[u8], s: Segment) -> Option<&[u8]> {
    let start = usize::try_from(s.offset).ok()?;
    let len = usize::try_from(s.filesz).ok()?;
    b.get(start..start.checked_add(len)?)
}

/// The NUL-terminated string at `at`.
fn c_string(b: &[u8], at: usize) -> Option<String> {
    let rest = b.get(at..)?;
    let end = rest.iter().position(|&c| c == 0)?;
    Some(String::from_utf8_lossy(&rest[..end]).into_owned())
}

/// Reads the linking of an ELF64 little-endian x86-64 executable. Errors say what is wrong
/// with the file (not ELF, another class or machine, truncated headers).
pub fn linking(bytes: &[u8]) -> Result<Linking, String> {
    if bytes.get(..4) != Some(MAGIC.as_slice()) {
        return Err("not an ELF file (no \\x7fELF magic)".into());
    }
    if bytes.get(4) != Some(&CLASS_64) || bytes.get(5) != Some(&DATA_LITTLE_ENDIAN) {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let truncated = || "truncated ELF header".to_owned();
    let machine = u16_at(bytes, 18).ok_or_else(truncated)?;
    if machine != MACHINE_X86_64 {
        return Err(format!(
            "ELF machine {machine}, not x86-64 ({MACHINE_X86_64})"
        ));
    }
    let phoff = u64_at(bytes, 32).ok_or_else(truncated)?;
    let phentsize = usize::from(u16_at(bytes, 54).ok_or_else(truncated)?);
    let phnum = usize::from(u16_at(bytes, 56).ok_or_else(truncated)?);
    if phentsize != PHDR_SIZE {
        return Err(format!("program header size {phentsize}, not {PHDR_SIZE}"));
    }
    let phoff = usize::try_from(phoff).map_err(|_| "program header offset too large")?;
    let mut segments = Vec::with_capacity(phnum);
    for i in 0..phnum {
        let at = phoff + i * PHDR_SIZE;
        let field = |off: usize| u64_at(bytes, at + off);
        let (Some(kind), Some(offset), Some(vaddr), Some(filesz)) =
            (u32_at(bytes, at), field(8), field(16), field(32))
        else {
            return Err(format!("program header {i} lies past the end of the file"));
        };
        segments.push(Segment {
            kind,
            offset,
            vaddr,
            filesz,
        });
    }

    let interpreter = match segments.iter().find(|s| s.kind == PT_INTERP) {
        Some(&s) => {
            let raw = segment_bytes(bytes, s).ok_or("PT_INTERP lies past the end of the file")?;
            Some(c_string(raw, 0).unwrap_or_else(|| String::from_utf8_lossy(raw).into_owned()))
        }
        None => None,
    };

    let mut needed = Vec::new();
    if let Some(&dynamic) = segments.iter().find(|s| s.kind == PT_DYNAMIC) {
        let raw =
            segment_bytes(bytes, dynamic).ok_or("PT_DYNAMIC lies past the end of the file")?;
        let mut strtab = None;
        let mut name_offsets = Vec::new();
        for entry in raw.chunks_exact(DYN_SIZE) {
            let (Some(tag), Some(value)) = (u64_at(entry, 0), u64_at(entry, 8)) else {
                break;
            };
            match tag {
                DT_NULL => break,
                DT_NEEDED => name_offsets.push(value),
                DT_STRTAB => strtab = Some(value),
                _ => {}
            }
        }
        // DT_STRTAB is an address: the loaded segment holding it says where it is in the file.
        let strtab_offset = strtab.and_then(|addr| {
            segments
                .iter()
                .filter(|s| s.kind == PT_LOAD)
                .find(|s| addr >= s.vaddr && addr < s.vaddr.saturating_add(s.filesz))
                .map(|s| s.offset + (addr - s.vaddr))
        });
        for name in name_offsets {
            let text = strtab_offset
                .and_then(|base| usize::try_from(base.checked_add(name)?).ok())
                .and_then(|at| c_string(bytes, at));
            needed.push(text.unwrap_or_else(|| "?".into()));
        }
    }
    Ok(Linking {
        interpreter,
        needed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 x86-64 image: a header, the given program headers, then `tail` at
    /// offset `64 + 56 * n`.
    fn image(segments: &[(u32, u64, u64, u64)], tail: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(MAGIC);
        b[4] = CLASS_64;
        b[5] = DATA_LITTLE_ENDIAN;
        b[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN, as a PIE is
        b[18..20].copy_from_slice(&MACHINE_X86_64.to_le_bytes());
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[54..56].copy_from_slice(&(PHDR_SIZE as u16).to_le_bytes());
        b[56..58].copy_from_slice(&(segments.len() as u16).to_le_bytes());
        for &(kind, offset, vaddr, filesz) in segments {
            let mut ph = vec![0u8; PHDR_SIZE];
            ph[..4].copy_from_slice(&kind.to_le_bytes());
            ph[8..16].copy_from_slice(&offset.to_le_bytes());
            ph[16..24].copy_from_slice(&vaddr.to_le_bytes());
            ph[32..40].copy_from_slice(&filesz.to_le_bytes());
            b.extend(ph);
        }
        b.extend_from_slice(tail);
        b
    }

    fn dyn_entries(entries: &[(u64, u64)]) -> Vec<u8> {
        entries
            .iter()
            .flat_map(|(t, v)| t.to_le_bytes().into_iter().chain(v.to_le_bytes()))
            .collect()
    }

    #[test]
    fn a_dynamic_executable_names_its_loader_and_libraries() {
        // Three headers: data starts at 64 + 3 * 56 = 232.
        let interp = b"/lib64/ld-linux-x86-64.so.2\0";
        let strtab = b"\0libc.so.6\0libgcc_s.so.1\0";
        let interp_at = 232u64;
        let strtab_at = interp_at + interp.len() as u64;
        let dyn_at = strtab_at + strtab.len() as u64;
        let dynamic = dyn_entries(&[
            (DT_NEEDED, 1),
            (DT_STRTAB, 0x1000 + strtab_at),
            (DT_NEEDED, 11),
            (DT_NULL, 0),
        ]);
        let mut tail = interp.to_vec();
        tail.extend_from_slice(strtab);
        tail.extend(&dynamic);
        let total = 232 + tail.len() as u64;
        let b = image(
            &[
                (
                    PT_INTERP,
                    interp_at,
                    0x1000 + interp_at,
                    interp.len() as u64,
                ),
                (PT_LOAD, 0, 0x1000, total),
                (PT_DYNAMIC, dyn_at, 0x1000 + dyn_at, dynamic.len() as u64),
            ],
            &tail,
        );
        let l = linking(&b).unwrap();
        assert_eq!(
            l.interpreter.as_deref(),
            Some("/lib64/ld-linux-x86-64.so.2")
        );
        assert_eq!(l.needed, ["libc.so.6", "libgcc_s.so.1"]);
        assert!(!l.is_static());
    }

    #[test]
    fn a_static_pie_has_a_dynamic_segment_and_still_is_static() {
        let dynamic = dyn_entries(&[(0x6fff_fffb, 0x0800_0001), (DT_NULL, 0)]);
        let b = image(&[(PT_DYNAMIC, 120, 0x2000, dynamic.len() as u64)], &dynamic);
        let l = linking(&b).unwrap();
        assert!(l.is_static(), "{l:?}");
    }

    #[test]
    fn bad_files_are_errors_not_panics() {
        assert!(linking(b"").unwrap_err().contains("not an ELF"));
        assert!(linking(b"#!/bin/sh\n").unwrap_err().contains("not an ELF"));
        let mut b = image(&[], &[]);
        b[4] = 1;
        assert!(linking(&b).unwrap_err().contains("64-bit"));
        let mut b = image(&[], &[]);
        b[18] = 183; // aarch64
        assert!(linking(&b).unwrap_err().contains("not x86-64"));
        // A header count that runs past the end of the file.
        let mut b = image(&[], &[]);
        b[56] = 9;
        assert!(linking(&b).unwrap_err().contains("past the end"));
        // A segment whose file image runs past the end.
        let b = image(&[(PT_INTERP, 100, 0, 1 << 40)], &[]);
        assert!(linking(&b).unwrap_err().contains("PT_INTERP"));
        // Every truncation of a valid file is an error or a reading, never a panic.
        let whole = image(
            &[(PT_DYNAMIC, 120, 0, 32)],
            &dyn_entries(&[(DT_NEEDED, 0), (0, 0)]),
        );
        for n in 0..whole.len() {
            let _ = linking(&whole[..n]);
        }
    }

    /// The machine's own executables: `sh` is dynamic on every Debian system.
    #[test]
    fn the_systems_shell_is_dynamic() {
        let bytes = std::fs::read("/bin/sh").unwrap();
        let l = linking(&bytes).unwrap();
        assert!(l.interpreter.is_some(), "{l:?}");
        assert!(l.needed.iter().any(|n| n.starts_with("libc.so")), "{l:?}");
    }
}
