//! Kernel structure field offsets from the running kernel's BTF (/sys/kernel/btf/vmlinux).
//!
//! The eBPF stack walk identifies the file behind a program counter through the VMA that
//! `bpf_find_vma` hands it (`vm_area_struct` → `file` → `inode` → `super_block`). aya 0.14 applies
//! no CO-RE relocations to Rust programs, so the agent reads the offsets from BTF here and sets
//! them as a global of the eBPF object at load time; the Python frame walk likewise gets the
//! offset of `task_struct.thread.fsbase` ([`task_fsbase_offset`]). This is a minimal BTF reader: type records
//! are walked only far enough to find named structs and their members (anonymous struct and
//! union members are followed, as `vm_start` sits in one since 6.x).

use std::collections::HashMap;

use anyhow::{Context as _, bail, ensure};

const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// One struct or union member: name, type id, offset in bits.
#[derive(Clone, Debug)]
struct Member {
    name: String,
    type_id: u32,
    bit_offset: u32,
}

/// The types of a BTF blob that matter here.
#[derive(Default)]
pub struct Btf {
    /// Type id → (kind, referenced type id for modifiers/typedefs, members for structs/unions).
    types: Vec<(u32, u32, Vec<Member>)>,
    /// Struct name → type id (the first with members, not a forward declaration).
    structs: HashMap<String, u32>,
}

impl Btf {
    /// Parse a raw BTF blob (the format of /sys/kernel/btf/vmlinux). Errors: not BTF, or
    /// truncated.
    pub fn parse(data: &[u8]) -> anyhow::Result<Btf> {
        let u16_at = |o: usize| -> anyhow::Result<u16> {
            Ok(u16::from_le_bytes(data.get(o..o + 2).context("BTF truncated")?.try_into()?))
        };
        let u32_at = |o: usize| -> anyhow::Result<u32> {
            Ok(u32::from_le_bytes(data.get(o..o + 4).context("BTF truncated")?.try_into()?))
        };
        ensure!(u16_at(0)? == 0xeb9f, "not little-endian BTF (bad magic)");
        let hdr_len = u32_at(4)? as usize;
        let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
        let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
        let strings =
            data.get(hdr_len + str_off..hdr_len + str_off + str_len).context("BTF string section truncated")?;
        let name = |off: u32| -> String {
            let s = strings.get(off as usize..).unwrap_or_default();
            let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
            String::from_utf8_lossy(&s[..end]).into_owned()
        };
        let mut btf = Btf { types: vec![(0, 0, Vec::new())], structs: HashMap::new() };
        let mut pos = hdr_len + type_off;
        let end = pos + type_len;
        ensure!(end <= data.len(), "BTF type section truncated");
        while pos + 12 <= end {
            let name_off = u32_at(pos)?;
            let info = u32_at(pos + 4)?;
            let size_or_type = u32_at(pos + 8)?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kind_flag = info >> 31 == 1;
            pos += 12;
            let mut members = Vec::new();
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = pos + i * 12;
                        let off = u32_at(m + 8)?;
                        members.push(Member {
                            name: name(u32_at(m)?),
                            type_id: u32_at(m + 4)?,
                            bit_offset: if kind_flag { off & 0xff_ffff } else { off },
                        });
                    }
                    12 * vlen
                }
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                0..=19 => 0,
                k => bail!("unknown BTF kind {k}"),
            };
            pos += extra;
            let id = btf.types.len() as u32;
            if kind == KIND_STRUCT && !members.is_empty() {
                btf.structs.entry(name(name_off)).or_insert(id);
            }
            btf.types.push((kind, size_or_type, members));
        }
        Ok(btf)
    }

    /// The running kernel's BTF.
    pub fn from_sys_fs() -> anyhow::Result<Btf> {
        let path = "/sys/kernel/btf/vmlinux";
        let data =
            std::fs::read(path).with_context(|| format!("reading {path} (a kernel with CONFIG_DEBUG_INFO_BTF)"))?;
        Btf::parse(&data).with_context(|| format!("parsing {path}"))
    }

    /// Skip typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.types.get(id as usize) {
                Some(&(KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG, next, _)) => {
                    id = next
                }
                _ => break,
            }
        }
        id
    }

    /// Bit offset of `field` in the struct or union `id`, looking into anonymous members.
    fn find(&self, id: u32, field: &str, depth: u32) -> Option<u32> {
        let (_, _, members) = self.types.get(self.resolve(id) as usize)?;
        for m in members {
            if m.name == field {
                return Some(m.bit_offset);
            }
        }
        if depth < 4 {
            for m in members.iter().filter(|m| m.name.is_empty()) {
                let inner = self.resolve(m.type_id);
                if matches!(self.types.get(inner as usize), Some(&(KIND_STRUCT | KIND_UNION, _, _)))
                    && let Some(off) = self.find(inner, field, depth + 1)
                {
                    return Some(m.bit_offset + off);
                }
            }
        }
        None
    }

    /// Byte offset of `field` in `struct name`. Errors: no such struct or field, or a bitfield.
    pub fn member_offset(&self, name: &str, field: &str) -> anyhow::Result<u32> {
        let id = *self.structs.get(name).with_context(|| format!("no struct {name} in the kernel's BTF"))?;
        let bits = self.find(id, field, 0).with_context(|| format!("no field {name}.{field} in the kernel's BTF"))?;
        ensure!(bits % 8 == 0, "{name}.{field} is a bitfield");
        Ok(bits / 8)
    }
}

/// The offsets `leaktrace_common::kernel_offset` names, in its order, from the running kernel.
pub fn kernel_offsets() -> anyhow::Result<[u32; leaktrace_common::kernel_offset::NUM]> {
    let btf = Btf::from_sys_fs()?;
    Ok([
        btf.member_offset("vm_area_struct", "vm_start")?,
        btf.member_offset("vm_area_struct", "vm_pgoff")?,
        btf.member_offset("vm_area_struct", "vm_file")?,
        btf.member_offset("file", "f_inode")?,
        btf.member_offset("inode", "i_ino")?,
        btf.member_offset("inode", "i_sb")?,
        btf.member_offset("super_block", "s_dev")?,
        btf.member_offset("vm_area_struct", "vm_end")?,
        btf.member_offset("task_struct", "real_parent")?,
        btf.member_offset("task_struct", "tgid")?,
    ])
}

/// Byte offset of `thread.fsbase` in `task_struct` (x86-64: the task's TLS base, which is its
/// threads' `pthread_self()`): how the eBPF side finds an allocating thread's own CPython thread
/// state. Errors: no BTF, or no such field (another architecture).
pub fn task_fsbase_offset() -> anyhow::Result<u32> {
    let btf = Btf::from_sys_fs()?;
    Ok(btf.member_offset("task_struct", "thread")? + btf.member_offset("thread_struct", "fsbase")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the machine that runs the tests: the kernel's BTF has every offset the walk needs,
    /// and they are distinct and plausible (vm_start near the start of vm_area_struct).
    #[test]
    fn running_kernel_offsets() {
        if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
            return;
        }
        let o = kernel_offsets().unwrap();
        assert!(o[0] < 64, "vm_start at {}", o[0]);
        assert_ne!(o[0], o[1]);
        assert_ne!(o[1], o[2]);
        assert!(o.iter().all(|&x| x < 4096));
    }

    /// On the machine that runs the tests (x86-64): `task_struct.thread.fsbase` is found and
    /// plausible (8-aligned, past the start of the several-KiB task_struct). Whether it is the
    /// right field is checked by the e2e tests (tests/tests/python.rs, threads that release the
    /// GIL get their own Python frames).
    #[test]
    fn running_kernel_fsbase() {
        if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() || !cfg!(target_arch = "x86_64") {
            return;
        }
        let off = task_fsbase_offset().unwrap();
        // task_struct is several KiB; `thread` is its last member (x86-64).
        assert!((1024..16384).contains(&off), "fsbase at {off}");
        assert_eq!(off % 8, 0);
    }

    #[test]
    fn rejects_garbage() {
        assert!(Btf::parse(b"not btf at all, really").is_err());
        assert!(Btf::parse(&[0x9f, 0xeb, 1, 0, 24, 0, 0, 0]).is_err());
    }
}
