//! The names by which the rest of the agent recognises CPython (the teardown function, the
//! objects that may hold the interpreter, an extension module's export). A leaf: it imports
//! nothing of the crate, so `discover.rs` and `symbolize.rs` read it without an import circle.

/// True when the ELF file at `path` exports a `PyInit_*` function: a CPython extension module
/// (the interpreter imports it by calling that function). False when unreadable or not ELF.
pub(crate) fn exports_python_init(path: &str) -> bool {
    use object::Object as _;
    use object::ObjectSymbol as _;
    let Ok(file) = std::fs::File::open(path) else { return false };
    let data = object::ReadCache::new(file);
    let Ok(obj) = object::File::parse(&data) else { return false };
    obj.dynamic_symbols().any(|s| s.is_definition() && s.name_bytes().is_ok_and(|n| n.starts_with(b"PyInit_")))
}

/// CPython's teardown: the interpreter frees its objects in `Py_FinalizeEx`, before `exit`.
pub const TEARDOWN_FUNCTION: &str = "Py_FinalizeEx";

/// Whether an object named `name` may hold CPython's interpreter (the executable or
/// libpython), whose symbol table is then read for [`TEARDOWN_FUNCTION`].
pub fn may_hold_interpreter(name: &str) -> bool {
    name.contains("python")
}
