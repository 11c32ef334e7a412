//! Every language from the first start: `doctor` lists each language's state,
//! `sandcall runtime install --toolchains` installs the missing toolchains' Debian
//! packages (or prints the exact apt-get line), and `serve`'s start names the
//! unavailable languages and that command. No test runs a real `apt-get install`: a
//! stand-in apt-get records what it was asked (`.ci/run`'s own run of the command is
//! the real check).

use crate::common::{runtime_dir, Server};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Every package of the list, in order, as the line installs them.
const ALL_PACKAGES: &str = "gcc libc6-dev g++ golang-go default-jdk-headless php-cli rustc r-base-core gfortran gdc";

/// A fresh directory under target/ (sandboxes replace /tmp): `name` in it, empty.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/it-toolchains")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // `toolchain_path` takes no `..`.
    std::fs::canonicalize(dir).unwrap()
}

/// `sandcall ARGS` with the test servers' runtime and `toolchain_path` set to `toolchains`.
fn sandcall(args: &[&str], toolchains: &Path, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandcall"));
    cmd.args(args)
        .env("SANDCALL_INSTALL_RUNTIME", "false")
        .env("SANDCALL_RUNTIME_DIR", runtime_dir())
        .env("SANDCALL_TOOLCHAIN_PATH", format!(r#"["{}"]"#, toolchains.display()))
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// `sandcall runtime install --toolchains` with its data in `data`, the toolchains looked
/// for in `toolchains`, and `path` as its PATH (where its apt-get is, if any).
fn install_toolchains(data: &Path, toolchains: &Path, path: &str) -> Output {
    let data = data.to_str().unwrap();
    let args = ["runtime", "install", "--toolchains", "--data-dir", data];
    sandcall(&args, toolchains, &[("PATH", path)]).output().unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A stand-in apt-get in `dir` that appends its arguments (and DEBIAN_FRONTEND) to
/// `dir/apt.log` and succeeds.
fn fake_apt_get(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let apt = dir.join("apt-get");
    std::fs::write(
        &apt,
        format!(
            "#!/usr/bin/bash\necho \"$DEBIAN_FRONTEND: $*\" >> {}\n",
            dir.join("apt.log").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&apt, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir.join("apt.log")
}

#[test]
fn doctor_lists_each_languages_state_and_the_packages_of_the_missing_toolchains() {
    crate::common::require_root();
    let empty = scratch("doctor-empty");
    let data = Server::new_dir().join("data");
    let out = sandcall(&["doctor", "--data-dir", data.to_str().unwrap()], &empty, &[])
        .output()
        .unwrap();
    let (stdout, _) = text(&out);
    // The compiled languages are optional: doctor still passes.
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "[pass] languages: 4 of 13 ready; `sandcall runtime install --toolchains` adds c, cpp, go, java, php, \
             rust, r, fortran, d (apt-get install -y --no-install-recommends {ALL_PACKAGES})"
        )),
        "{stdout}"
    );
    for ready in ["python", "bash", "javascript", "typescript"] {
        assert!(
            stdout.contains(&format!("\n       - {ready}: ready (")),
            "{ready}: {stdout}"
        );
    }
    let where_ = empty.display();
    for (language, packages, tool) in [
        ("c", "packages gcc libc6-dev", "gcc"),
        ("cpp", "packages g++ libc6-dev", "g++"),
        ("go", "package golang-go", "go"),
        ("java", "package default-jdk-headless", "java, javac"),
        ("php", "package php-cli", "php"),
        ("rust", "package rustc", "rustc, cc"),
        ("r", "package r-base-core", "Rscript"),
        ("fortran", "packages gfortran libc6-dev", "gfortran"),
        ("d", "packages gdc libc6-dev", "gdc"),
    ] {
        let line = format!(
            "\n       - {language}: missing toolchain (Debian {packages}): {tool} not found in {where_} (config \
             `toolchain_path`)\n"
        );
        assert!(stdout.contains(&line), "{line:?} in {stdout}");
    }
    // With the machine's own toolchains (CI installs them all): every language ready,
    // with the commands it runs, and no command offered.
    let out = sandcall(
        &["doctor", "--data-dir", data.to_str().unwrap()],
        Path::new("/usr/bin"),
        &[],
    )
    .output()
    .unwrap();
    let (stdout, _) = text(&out);
    assert!(stdout.contains("[pass] languages: 13 of 13 ready\n"), "{stdout}");
    assert!(stdout.contains("\n       - go: ready (/usr/bin/go)\n"), "{stdout}");
    assert!(
        stdout.contains("\n       - typescript: ready (/usr/bin/node, "),
        "{stdout}"
    );
    assert!(!stdout.contains("--toolchains"), "{stdout}");
    std::fs::remove_dir_all(&empty).unwrap();
}

#[test]
fn without_apt_get_runtime_install_toolchains_prints_the_exact_apt_line_and_fails() {
    crate::common::require_root();
    let empty = scratch("no-apt");
    let data = Server::new_dir().join("data");
    // PATH holds no apt-get (and nothing else).
    let out = install_toolchains(&data, &empty, empty.to_str().unwrap());
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_eq!(
        stdout,
        format!("apt-get install -y --no-install-recommends {ALL_PACKAGES}\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains("cannot install the compiled languages' toolchains here: apt-get is not on PATH"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&empty).unwrap();
}

#[test]
fn not_root_runtime_install_toolchains_prints_the_line_and_runs_nothing() {
    use std::os::unix::process::CommandExt;
    crate::common::require_root();
    let empty = scratch("not-root");
    // Under the test's own directory, which the user can reach (target/ may not be).
    let bin = Server::new_dir();
    let log = fake_apt_get(&bin);
    // The user's own copy of the binary (the build directory may be out of its reach).
    let exe = bin.join("sandcall");
    std::fs::copy(env!("CARGO_BIN_EXE_sandcall"), &exe).unwrap();
    let data = Server::new_dir().join("data");
    let out = Command::new(&exe)
        .args(["runtime", "install", "--toolchains", "--data-dir"])
        .arg(&data)
        .env("SANDCALL_TOOLCHAIN_PATH", format!(r#"["{}"]"#, empty.display()))
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_eq!(
        stdout,
        format!("apt-get install -y --no-install-recommends {ALL_PACKAGES}\n"),
        "{stderr}"
    );
    assert!(stderr.contains("installing packages needs root"), "{stderr}");
    assert!(!log.exists(), "apt-get ran without root");
    std::fs::remove_dir_all(&empty).unwrap();
    std::fs::remove_dir_all(&bin).unwrap();
}

#[test]
fn as_root_runtime_install_toolchains_asks_apt_get_for_only_the_missing_packages() {
    crate::common::require_root();
    // A toolchain directory that has `gcc` (C is ready, so gcc is not asked for) and a
    // stand-in apt-get that installs nothing.
    let toolchains = scratch("root-toolchains");
    std::os::unix::fs::symlink("/usr/bin/gcc", toolchains.join("gcc")).unwrap();
    let bin = scratch("root-bin");
    let log = fake_apt_get(&bin);
    let data = Server::new_dir().join("data");
    let out = install_toolchains(&data, &toolchains, &format!("{}:/usr/bin:/bin", bin.display()));
    let (stdout, stderr) = text(&out);
    let asked = std::fs::read_to_string(&log).unwrap_or_default();
    let wanted = "g++ libc6-dev golang-go default-jdk-headless php-cli rustc r-base-core gfortran gdc";
    assert!(
        asked
            .lines()
            .any(|l| l == format!("noninteractive: install -y --no-install-recommends {wanted}")),
        "apt-get was asked: {asked:?}; {stderr}"
    );
    assert!(!asked.contains(" gcc "), "{asked}");
    // It installed nothing, and the command says so rather than claim success.
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("the packages are installed but cpp, go, java, php, rust, r, fortran, d still cannot run"),
        "{stderr}"
    );
    // With every toolchain found, there is nothing to do and apt-get is not run.
    std::fs::remove_file(&log).unwrap();
    let out = install_toolchains(
        &data,
        Path::new("/usr/bin"),
        &format!("{}:/usr/bin:/bin", bin.display()),
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("every compiled language's toolchain is installed"),
        "{stderr}"
    );
    assert!(!log.exists(), "apt-get ran with nothing to install");
    std::fs::remove_dir_all(&toolchains).unwrap();
    std::fs::remove_dir_all(&bin).unwrap();
}

#[test]
fn serve_names_the_unavailable_languages_and_the_command_once_at_its_start() {
    crate::common::require_root();
    let empty = scratch("serve-notice");
    let data = Server::new_dir().join("data");
    let mut child = sandcall(
        &["serve", "--listen", "127.0.0.1:0", "--data-dir", data.to_str().unwrap()],
        &empty,
        &[("SANDCALL_WARM_POOL_SIZE", "0"), ("SANDCALL_LOG", "warn")],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let started = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .any(|l| l.starts_with("sandcall listening on "));
    // Our own child.
    let _ = child.kill();
    let _ = child.wait();
    let stderr = err.join().unwrap();
    assert!(started, "{stderr}");
    let notice = format!(
        "sandcall: 9 of 13 languages are unavailable on this server: c, cpp, go, java, php, rust, r, fortran, d. \
         The toolchains of c, cpp, go, java, php, rust, r, fortran, d are not installed: `sandcall runtime install \
         --toolchains` adds them (apt-get install -y --no-install-recommends {ALL_PACKAGES}). `sandcall doctor` \
         lists every language's state.\n"
    );
    assert_eq!(stderr.matches(&notice).count(), 1, "{stderr}");
    std::fs::remove_dir_all(&empty).unwrap();
}
