//! Puts the directory dsqwen-sys linked libdsqwen from (DEP_DSQWEN_LIB_DIR:
//! $DSQWEN_LIB_DIR, or pkg-config's -L) into the example's rpath, so it runs
//! without LD_LIBRARY_PATH from a build tree or a staging prefix.  A library
//! installed where the loader looks (e.g. /usr/local/lib after ldconfig)
//! needs no rpath.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_DSQWEN_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_DSQWEN_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
