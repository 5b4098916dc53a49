//! Finds libdsqwen for the linker: $DSQWEN_LIB_DIR (a build tree or an
//! install's lib directory) if set, else `pkg-config --libs dsqwen` (an
//! install in the default prefix needs nothing; another prefix needs
//! PKG_CONFIG_PATH=PREFIX/lib/pkgconfig), else -ldsqwen on the default
//! linker path.  The directory found is passed on to dependents'
//! build scripts as DEP_DSQWEN_LIB_DIR (Cargo's `links` metadata), e.g. for
//! an rpath.  No crates needed (pkg-config is run as a program).
use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=DSQWEN_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    if let Ok(dir) = env::var("DSQWEN_LIB_DIR") {
        println!("cargo:rustc-link-search=native={dir}");
        println!("cargo:rustc-link-lib=dylib=dsqwen");
        println!("cargo:lib_dir={dir}");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        return;
    }
    match Command::new("pkg-config").args(["--libs", "dsqwen"]).output() {
        Ok(out) if out.status.success() => {
            for flag in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Some(dir) = flag.strip_prefix("-L") {
                    println!("cargo:rustc-link-search=native={dir}");
                    println!("cargo:lib_dir={dir}");
                    // this crate's own tests run against the library found
                    println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
                } else if let Some(lib) = flag.strip_prefix("-l") {
                    println!("cargo:rustc-link-lib=dylib={lib}");
                }
            }
        }
        _ => {
            println!("cargo:warning=`pkg-config --libs dsqwen` failed (is libdsqwen installed? \
                      PKG_CONFIG_PATH=PREFIX/lib/pkgconfig for a non-default prefix); \
                      trying -ldsqwen on the default search path");
            println!("cargo:rustc-link-lib=dylib=dsqwen");
        }
    }
}
