//! The library directory dsqwen-sys found (DEP_DSQWEN_LIB_DIR) goes into the
//! rpath of this crate's own test binaries, so `cargo test` runs against
//! the library it linked, without LD_LIBRARY_PATH.  (Cargo does not pass
//! link arguments on to dependents: an application using this crate finds
//! libdsqwen like any shared library -- installed in a directory the loader
//! knows (ldconfig), or its own rpath / LD_LIBRARY_PATH.)
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_DSQWEN_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_DSQWEN_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
