//! Finds libdsqwen for the linker: $DSQWEN_LIB_DIR (a build tree or an
//! install's lib directory) if set, else `pkg-config --libs dsqwen`, else the
//! default linker search path.  A directory found either way also goes into
//! the binary's rpath, so the example runs without LD_LIBRARY_PATH.
use std::env;
use std::process::Command;

fn link_dir(dir: &str) {
    println!("cargo:rustc-link-search=native={dir}");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
}

fn main() {
    println!("cargo:rerun-if-env-changed=DSQWEN_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    if let Ok(dir) = env::var("DSQWEN_LIB_DIR") {
        link_dir(&dir);
        println!("cargo:rustc-link-lib=dylib=dsqwen");
        return;
    }
    match Command::new("pkg-config").args(["--libs", "dsqwen"]).output() {
        Ok(out) if out.status.success() => {
            for flag in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Some(dir) = flag.strip_prefix("-L") {
                    link_dir(dir);
                } else if let Some(lib) = flag.strip_prefix("-l") {
                    println!("cargo:rustc-link-lib=dylib={lib}");
                }
            }
        }
        _ => {
            println!("cargo:warning=neither DSQWEN_LIB_DIR nor `pkg-config dsqwen` found; \
                      trying -ldsqwen on the default search path");
            println!("cargo:rustc-link-lib=dylib=dsqwen");
        }
    }
}
