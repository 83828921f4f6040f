//! The object layouts a census reads, per CPython version. Measured with `offsetof` and
//! `sizeof` on each version's own headers (pyenv 3.8.18, 3.9.18, 3.10.13, 3.11.7, 3.12.1,
//! 3.13.0; `Include/internal/pycore_gc.h`, `pycore_interp.h`, `pycore_dict.h`,
//! `cpython/funcobject.h` ..., built with `Py_BUILD_CORE`), 64-bit, default (GIL) builds.
//! Offsets shared by every version (`PyObject`, `PyTypeObject`, list, tuple, cell, method,
//! module, set, bytes) are constants here.

/// `ob_refcnt`, `ob_type`, `ob_size` (var objects).
pub const OB_REFCNT: u64 = 0;
pub const OB_TYPE: u64 = 8;
pub const OB_SIZE: u64 = 16;
/// `PyTypeObject` fields (3.8–3.13).
pub const TP_NAME: u64 = 24;
pub const TP_BASICSIZE: u64 = 32;
pub const TP_ITEMSIZE: u64 = 40;
pub const TP_FLAGS: u64 = 168;
pub const TP_DICT: u64 = 264;
pub const TP_DICTOFFSET: u64 = 288;
/// `sizeof(PyGC_Head)`: the collector's header before each container.
pub const GC_HEAD: u64 = 16;
/// `PyListObject.ob_item`, `.allocated`; `PyTupleObject.ob_item`.
pub const LIST_ITEM: u64 = 24;
pub const LIST_ALLOCATED: u64 = 32;
pub const TUPLE_ITEM: u64 = 24;
/// `PyCellObject.ob_ref`; `PyMethodObject.im_func`, `.im_self`; `PyModuleObject.md_dict`.
pub const CELL_REF: u64 = 16;
pub const METHOD_FUNC: u64 = 16;
pub const METHOD_SELF: u64 = 24;
pub const MODULE_DICT: u64 = 16;
/// `PySetObject.fill`, `.mask`, `.table`; a `setentry` is {key, hash}.
pub const SET_MASK: u64 = 32;
pub const SET_TABLE: u64 = 40;
/// `PyDictObject.ma_used`, `.ma_keys`, `.ma_values`.
pub const MA_USED: u64 = 16;
pub const MA_KEYS: u64 = 32;
pub const MA_VALUES: u64 = 40;
/// `dequeobject`: `leftblock`, `rightblock`, `leftindex`, `rightindex` (Modules/
/// _collectionsmodule.c, 3.8–3.13); a block is {leftlink, data[64], rightlink}.
pub const DEQUE_LEFTBLOCK: u64 = 24;
pub const DEQUE_RIGHTBLOCK: u64 = 32;
pub const DEQUE_LEFTINDEX: u64 = 40;
pub const DEQUE_RIGHTINDEX: u64 = 48;
pub const DEQUE_BLOCKLEN: u64 = 64;

/// `tp_flags` bits (Include/object.h).
pub mod flags {
    pub const INLINE_VALUES: u64 = 1 << 2;
    pub const MANAGED_DICT: u64 = 1 << 4;
    pub const HEAPTYPE: u64 = 1 << 9;
    pub const HAVE_GC: u64 = 1 << 14;
    pub const LONG_SUBCLASS: u64 = 1 << 24;
    pub const LIST_SUBCLASS: u64 = 1 << 25;
    pub const TUPLE_SUBCLASS: u64 = 1 << 26;
    pub const BYTES_SUBCLASS: u64 = 1 << 27;
    pub const UNICODE_SUBCLASS: u64 = 1 << 28;
    pub const DICT_SUBCLASS: u64 = 1 << 29;
    pub const TYPE_SUBCLASS: u64 = 1 << 31;
}

/// How an instance's managed dict is kept (3.11+, `Py_TPFLAGS_MANAGED_DICT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Managed {
    /// Before 3.11: only `tp_dictoffset`.
    None,
    /// 3.11: the dict pointer at −24, the values pointer at −32.
    Split311,
    /// 3.12: one word at −24, the values pointer + 1 (odd) or the dict.
    Tagged312,
    /// 3.13: the dict pointer at −24; without it, the values inline after the header
    /// (`PyDictValues` {capacity, size, embedded, valid} then the values) when
    /// `Py_TPFLAGS_INLINE_VALUES`.
    Inline313,
}

/// The offsets that differ between versions.
#[derive(Clone, Copy, Debug)]
pub struct HeapLayout {
    pub version: (u8, u8),
    /// Offset of `struct _gc_runtime_state` in the main `PyInterpreterState` (3.9+), or in
    /// `_PyRuntime` (3.8: [`HeapLayout::gc_in_runtime`]).
    pub gc_state: u64,
    pub gc_in_runtime: bool,
    /// In `_gc_runtime_state`: `generations[3]` (each {PyGC_Head head; int threshold, count},
    /// 24 bytes), `permanent_generation`, `collecting`.
    pub gc_generations: u64,
    pub gc_permanent: u64,
    pub gc_collecting: u64,
    /// `PyFunctionObject` fields.
    pub func_defaults: u64,
    pub func_kwdefaults: u64,
    pub func_closure: u64,
    pub func_dict: u64,
    pub func_qualname: u64,
    /// Dict keys: 3.11+ layout (`dk_log2_size`, `dk_log2_index_bytes`, `dk_kind`), else the
    /// 3.8–3.10 one (`dk_size` at 8, `dk_nentries` at 32, indices at 40).
    pub dict311: bool,
    /// `PyHeapTypeObject.ht_cached_keys` (3.11+; 0 before).
    pub ht_cached_keys: u64,
    /// Offset of the values in a `PyDictValues` (3.13: after its 4 bytes of counts, 8).
    pub values_offset: u64,
    pub managed: Managed,
    /// `sizeof(PyASCIIObject)`, `sizeof(PyCompactUnicodeObject)`.
    pub ascii_header: u64,
    pub compact_header: u64,
    /// 3.12+: `PyLongObject.long_value.lv_tag` (digit count << 3) in place of `ob_size`.
    pub long_tag: bool,
}

const BASE: HeapLayout = HeapLayout {
    version: (3, 11),
    gc_state: 648,
    gc_in_runtime: false,
    gc_generations: 24,
    gc_permanent: 104,
    gc_collecting: 200,
    func_defaults: 56,
    func_kwdefaults: 64,
    func_closure: 72,
    func_dict: 88,
    func_qualname: 40,
    dict311: true,
    ht_cached_keys: 872,
    values_offset: 0,
    managed: Managed::Split311,
    ascii_header: 48,
    compact_header: 72,
    long_tag: false,
};

const FUNC_38: HeapLayout = HeapLayout {
    func_defaults: 32,
    func_kwdefaults: 40,
    func_closure: 48,
    func_dict: 72,
    func_qualname: 104,
    dict311: false,
    ht_cached_keys: 0,
    managed: Managed::None,
    ..BASE
};

/// The supported versions.
pub const HEAP_LAYOUTS: &[HeapLayout] = &[
    HeapLayout { version: (3, 8), gc_state: 344, gc_in_runtime: true, ..FUNC_38 },
    HeapLayout { version: (3, 9), gc_state: 616, ..FUNC_38 },
    HeapLayout { version: (3, 10), gc_state: 616, dict311: false, ht_cached_keys: 0, managed: Managed::None, ..BASE },
    BASE,
    HeapLayout {
        version: (3, 12),
        gc_state: 112,
        ht_cached_keys: 880,
        managed: Managed::Tagged312,
        ascii_header: 40,
        compact_header: 56,
        long_tag: true,
        ..BASE
    },
    HeapLayout {
        version: (3, 13),
        gc_state: 7400,
        ht_cached_keys: 880,
        values_offset: 8,
        managed: Managed::Inline313,
        ascii_header: 40,
        compact_header: 56,
        long_tag: true,
        ..BASE
    },
];

/// The layout of CPython `major.minor`, if supported.
pub fn for_version(v: (u8, u8)) -> Option<HeapLayout> {
    HEAP_LAYOUTS.iter().find(|l| l.version == v).copied()
}
