//! Field offsets of kernel structures, from the running kernel's BTF
//! (`/sys/kernel/btf/vmlinux`): what the thread-dump iterator needs to read `task_struct`
//! without CO-RE relocations, which the kernel programs do not have. A minimal reader of the
//! BTF type section: struct names, their members' names and bit offsets, anonymous members
//! followed into; nothing else is decoded (aya's parser keeps members private).

use std::collections::HashMap;

use profiler_common::{TaskOffsets, UprobeOffsets};

/// Where the running kernel's BTF is.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Why an offset could not be found.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("failed to read {path}")]
    Read {
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is not a BTF blob this reader understands")]
    Malformed(&'static str),
    #[error("the kernel's BTF has no struct {0}")]
    NoStruct(String),
    #[error("the kernel's BTF has no field {field} in struct {structure}")]
    NoField { structure: String, field: String },
}

// BTF kinds (include/uapi/linux/btf.h).
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;

/// One struct or union: its size and members (name, type id, bit offset).
#[derive(Debug, Clone)]
struct Composite {
    size: u32,
    members: Vec<(String, u32, u32)>,
}

/// The structs and unions of a BTF blob, by type id, and named ones by name.
#[derive(Debug, Default)]
pub struct Types {
    composites: HashMap<u32, Composite>,
    by_name: HashMap<String, u32>,
}

impl Types {
    /// Reads the running kernel's BTF.
    pub fn vmlinux() -> Result<Self, BtfError> {
        let bytes = std::fs::read(VMLINUX_BTF).map_err(|source| BtfError::Read { path: VMLINUX_BTF, source })?;
        Self::parse(&bytes).ok_or(BtfError::Malformed(VMLINUX_BTF))
    }

    /// Parses a little-endian BTF blob; `None` when it is malformed.
    fn parse(bytes: &[u8]) -> Option<Self> {
        let u16_at = |at: usize| Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?));
        let u32_at = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
        if u16_at(0)? != 0xeb9f {
            return None;
        }
        let header = u32_at(4)? as usize;
        let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
        let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
        let strings = bytes.get(header + str_off..header + str_off + str_len)?;
        let name = |offset: u32| -> Option<String> {
            let tail = strings.get(offset as usize..)?;
            let end = tail.iter().position(|&b| b == 0)?;
            Some(String::from_utf8_lossy(&tail[..end]).into_owned())
        };
        let mut types = Types::default();
        let (mut at, end) = (header + type_off, header + type_off + type_len);
        let mut id = 1u32;
        while at < end {
            let (name_off, info, size) = (u32_at(at)?, u32_at(at + 4)?, u32_at(at + 8)?);
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            at += 12;
            if kind == KIND_STRUCT || kind == KIND_UNION {
                let bitfields = info >> 31 == 1;
                let mut members = Vec::with_capacity(vlen);
                for i in 0..vlen {
                    let m = at + 12 * i;
                    let offset = u32_at(m + 8)?;
                    let bits = if bitfields { offset & 0x00ff_ffff } else { offset };
                    members.push((name(u32_at(m)?)?, u32_at(m + 4)?, bits));
                }
                let named = name(name_off)?;
                if !named.is_empty() {
                    types.by_name.entry(named).or_insert(id);
                }
                types.composites.insert(id, Composite { size, members });
            }
            at += match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                _ => 0,
            };
            id += 1;
        }
        Some(types)
    }

    /// The byte offset of `field` in struct `structure`, looking into anonymous members.
    pub fn offset(&self, structure: &str, field: &str) -> Result<u32, BtfError> {
        let id = *self.by_name.get(structure).ok_or_else(|| BtfError::NoStruct(structure.into()))?;
        self.find(id, field)
            .map(|bits| bits / 8)
            .ok_or_else(|| BtfError::NoField { structure: structure.into(), field: field.into() })
    }

    /// The size of struct `structure` in bytes.
    pub fn size(&self, structure: &str) -> Result<u32, BtfError> {
        let id = self.by_name.get(structure).ok_or_else(|| BtfError::NoStruct(structure.into()))?;
        Ok(self.composites[id].size)
    }

    /// The bit offset of `field` in composite `id`.
    fn find(&self, id: u32, field: &str) -> Option<u32> {
        let composite = self.composites.get(&id)?;
        for (name, type_id, bits) in &composite.members {
            if name == field {
                return Some(*bits);
            }
            if name.is_empty() {
                // An anonymous member's type is the struct or union itself.
                if let Some(inner) = self.find(*type_id, field) {
                    return Some(bits + inner);
                }
            }
        }
        None
    }
}

/// The `task_struct` and `struct pid` offsets the thread-dump iterator reads.
pub fn task_offsets(types: &Types) -> Result<TaskOffsets, BtfError> {
    Ok(TaskOffsets {
        pid: types.offset("task_struct", "pid")?,
        tgid: types.offset("task_struct", "tgid")?,
        on_cpu: types.offset("task_struct", "on_cpu")?,
        state: types.offset("task_struct", "__state")?,
        nvcsw: types.offset("task_struct", "nvcsw")?,
        nivcsw: types.offset("task_struct", "nivcsw")?,
        thread_pid: types.offset("task_struct", "thread_pid")?,
        pid_numbers: types.offset("pid", "numbers")?,
        upid_size: types.size("upid")?,
        pid_level: types.offset("pid", "level")?,
    })
}

/// The offset of `task_struct.thread.fsbase`: a thread's TLS base, where Go keeps its
/// current goroutine (the label read of Go processes).
pub fn fsbase_offset(types: &Types) -> Result<u32, BtfError> {
    Ok(types.offset("task_struct", "thread")? + types.offset("thread_struct", "fsbase")?)
}

/// Where the kernel keeps what its uprobes moved (see [`UprobeOffsets`]); an error when
/// this kernel lacks one of the fields (no uprobes).
pub fn uprobe_offsets(types: &Types) -> Result<UprobeOffsets, BtfError> {
    Ok(UprobeOffsets {
        task_utask: types.offset("task_struct", "utask")?,
        utask_return_instances: types.offset("uprobe_task", "return_instances")?,
        utask_xol_vaddr: types.offset("uprobe_task", "xol_vaddr")?,
        utask_vaddr: types.offset("uprobe_task", "vaddr")?,
        instance_stack: types.offset("return_instance", "stack")?,
        instance_return_address: types.offset("return_instance", "orig_ret_vaddr")?,
        instance_next: types.offset("return_instance", "next")?,
        task_mm: types.offset("task_struct", "mm")?,
        mm_xol_area: types.offset("mm_struct", "uprobes_state")? + types.offset("uprobes_state", "xol_area")?,
        xol_vaddr: types.offset("xol_area", "vaddr")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_struct_offsets_have_their_shape() {
        // What a read at these offsets gives is checked in the kernel, end to end: every
        // dumped thread's tid is a /proc/PID/task entry (tests/threads.rs). Here: their
        // shape, inside the struct, pid and tgid adjacent as the kernel declares them.
        let types = match Types::vmlinux() {
            Ok(types) => types,
            Err(BtfError::Read { .. }) => {
                eprintln!("skipped: this kernel exposes no BTF at {VMLINUX_BTF}");
                return;
            }
            Err(err) => panic!("{err}"),
        };
        let offsets = task_offsets(&types).unwrap();
        assert_eq!(offsets.tgid, offsets.pid + 4, "{offsets:?}");
        assert_eq!(offsets.nivcsw, offsets.nvcsw + 8, "{offsets:?}");
        let size = types.size("task_struct").unwrap();
        for offset in [offsets.pid, offsets.on_cpu, offsets.state, offsets.thread_pid] {
            assert!(offset < size, "{offsets:?}");
        }
        assert_eq!(offsets.upid_size, 16, "int nr and a namespace pointer");
        assert!(offsets.pid_level < offsets.pid_numbers, "numbers[] ends struct pid: {offsets:?}");
        assert!(matches!(types.offset("task_struct", "no_such_field"), Err(BtfError::NoField { .. })));
    }

    #[test]
    fn uprobe_offsets_have_their_shape() {
        // That walks restore through them is checked end to end (tests/heap.rs: CPU samples
        // inside a probed malloc reach main). Here: this kernel has every field, and the
        // instance's slot and original address are adjacent as the kernel declares them.
        let Ok(types) = Types::vmlinux() else {
            eprintln!("skipped: this kernel exposes no BTF at {VMLINUX_BTF}");
            return;
        };
        let offsets = uprobe_offsets(&types).unwrap();
        assert_eq!(offsets.instance_return_address, offsets.instance_stack + 8, "{offsets:?}");
        assert!(offsets.task_utask > 0 && offsets.task_mm > 0, "{offsets:?}");
        assert!(offsets.mm_xol_area < types.size("mm_struct").unwrap(), "{offsets:?}");
    }

    #[test]
    fn refuses_what_is_not_btf() {
        assert!(Types::parse(&[0; 64]).is_none());
        assert!(Types::parse(&[0x9f, 0xeb, 1, 0, 24, 0, 0, 0]).is_none(), "a truncated header");
    }
}
