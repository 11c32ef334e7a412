//! The compiled languages (C, C++, Go, Java, PHP, Rust, R, Fortran, D) and the languages
//! an operator declares, over HTTP: each compiles and runs inside the run's sandbox and
//! limits, with args, stdin, stderr, exit code and files as in Python; a compile error is
//! a failed run with the compiler's message. Their toolchains are Debian's, which
//! `.ci/run` installs: a missing one fails these tests, loudly.

use crate::common::Server;
use crate::files::{download_output, Client};
use serde_json::{json, Value};
use std::path::Path;

/// One language's programs and what they must print.
struct Case {
    lang: &'static str,
    /// The commands its toolchain needs in /usr/bin, and the Debian package.
    tools: &'static [&'static str],
    package: &'static str,
    /// Prints `args=A,B stdin=LINE file=IN` (in.txt's first line), writes out.txt
    /// (`from LANG\n`), prints `warn` on stderr and exits 3.
    main: &'static str,
    /// Fails at run time: the status, and what stderr must hold (the user's line where
    /// the language gives one).
    runtime_error: &'static str,
    runtime_status: &'static str,
    runtime_stderr: &'static str,
    /// Does not compile (or parse): what stderr must hold.
    compile_error: &'static str,
    compile_stderr: &'static str,
}

const CASES: &[Case] = &[
    Case {
        lang: "c",
        tools: &["gcc"],
        package: "gcc",
        main: r#"#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    char line[64] = "", file[64] = "";
    fgets(line, sizeof line, stdin);
    line[strcspn(line, "\n")] = 0;
    FILE *f = fopen("in.txt", "r");
    fgets(file, sizeof file, f);
    fclose(f);
    file[strcspn(file, "\n")] = 0;
    printf("args=%s,%s stdin=%s file=%s\n", argv[1], argv[2], line, file);
    FILE *o = fopen("out.txt", "w");
    fputs("from c\n", o);
    fclose(o);
    fprintf(stderr, "warn\n");
    return 3;
}
"#,
        runtime_error: "int main(void) {\n    volatile int *p = 0;\n    return *p;\n}\n",
        runtime_status: "killed",
        runtime_stderr: "",
        compile_error: "int main(void) {\n    return missing;\n}\n",
        compile_stderr: "main.c:2:12: error: 'missing' undeclared",
    },
    Case {
        lang: "cpp",
        tools: &["g++"],
        package: "g++",
        main: r#"#include <fstream>
#include <iostream>
#include <string>
int main(int argc, char **argv) {
    std::string line, file;
    std::getline(std::cin, line);
    std::ifstream in("in.txt");
    std::getline(in, file);
    std::cout << "args=" << argv[1] << "," << argv[2] << " stdin=" << line << " file=" << file << "\n";
    std::ofstream("out.txt") << "from cpp\n";
    std::cerr << "warn\n";
    return 3;
}
"#,
        runtime_error: "#include <stdexcept>\nint main() {\n    throw std::runtime_error(\"boom\");\n}\n",
        runtime_status: "killed",
        runtime_stderr: "what():  boom",
        compile_error: "int main() {\n    return missing;\n}\n",
        compile_stderr: "main.cpp:2:12: error: 'missing' was not declared",
    },
    Case {
        lang: "go",
        tools: &["go"],
        package: "golang-go",
        main: r#"package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

func main() {
	line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	file, _ := os.ReadFile("in.txt")
	fmt.Printf("args=%s,%s stdin=%s file=%s\n", os.Args[1], os.Args[2], strings.TrimSpace(line), strings.Split(string(file), "\n")[0])
	os.WriteFile("out.txt", []byte("from go\n"), 0o644)
	fmt.Fprintln(os.Stderr, "warn")
	os.Exit(3)
}
"#,
        runtime_error: "package main\n\nfunc main() {\n\tpanic(\"boom\")\n}\n",
        runtime_status: "failed",
        runtime_stderr: "/run/sandcall/main.go:4",
        compile_error: "package main\n\nfunc main() {\n\tx := 1\n}\n",
        compile_stderr: "main.go:4:2: x declared but not used",
    },
    Case {
        lang: "java",
        tools: &["java"],
        package: "default-jdk-headless",
        main: r#"import java.io.*;
import java.nio.file.*;

public class Program {
    public static void main(String[] args) throws Exception {
        String line = new BufferedReader(new InputStreamReader(System.in)).readLine();
        String file = Files.readAllLines(Path.of("in.txt")).get(0);
        System.out.println("args=" + args[0] + "," + args[1] + " stdin=" + line + " file=" + file);
        Files.writeString(Path.of("out.txt"), "from java\n");
        System.err.println("warn");
        System.exit(3);
    }
}
"#,
        runtime_error: "public class Main {\n    public static void main(String[] args) {\n        throw new IllegalStateException(\"boom\");\n    }\n}\n",
        runtime_status: "failed",
        runtime_stderr: "at Main.main(Main.java:3)",
        compile_error: "public class Main {\n    public static void main(String[] args) {\n        int x = \"s\";\n    }\n}\n",
        compile_stderr: "Main.java:3: error: incompatible types",
    },
    Case {
        lang: "php",
        tools: &["php"],
        package: "php-cli",
        main: r#"<?php
$line = trim(fgets(STDIN));
$file = explode("\n", file_get_contents("in.txt"))[0];
echo "args={$argv[1]},{$argv[2]} stdin=$line file=$file\n";
file_put_contents("out.txt", "from php\n");
fwrite(STDERR, "warn\n");
exit(3);
"#,
        runtime_error: "<?php\nthrow new Exception(\"boom\");\n",
        runtime_status: "failed",
        runtime_stderr: "Uncaught Exception: boom in /run/sandcall/main.php:2",
        compile_error: "<?php\necho \"a\" \"b\";\n",
        compile_stderr: "syntax error",
    },
    Case {
        lang: "rs",
        tools: &["rustc", "cc"],
        package: "rustc",
        main: r#"use std::io::BufRead;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let file = std::fs::read_to_string("in.txt").unwrap();
    println!("args={},{} stdin={} file={}", args[1], args[2], line.trim(), file.lines().next().unwrap());
    std::fs::write("out.txt", "from rs\n").unwrap();
    eprintln!("warn");
    std::process::exit(3);
}
"#,
        runtime_error: "fn main() {\n    let v: Vec<i32> = Vec::new();\n    println!(\"{}\", v[3]);\n}\n",
        runtime_status: "failed",
        runtime_stderr: "main.rs:3:20",
        compile_error: "fn main() {\n    let x: i32 = \"s\";\n}\n",
        compile_stderr: "--> main.rs:2:18",
    },
    Case {
        lang: "r",
        tools: &["Rscript"],
        package: "r-base-core",
        main: r#"args <- commandArgs(trailingOnly = TRUE)
line <- readLines(file("stdin"), n = 1)
file <- readLines("in.txt", n = 1)
cat(sprintf("args=%s,%s stdin=%s file=%s\n", args[1], args[2], line, file))
writeLines("from r", "out.txt")
write("warn", stderr())
quit(status = 3)
"#,
        // R names no line for an error at the top level.
        runtime_error: "x <- 1\nstop(\"boom\")\n",
        runtime_status: "failed",
        runtime_stderr: "Error: boom",
        compile_error: "x <- (1\ny <- 2\n",
        compile_stderr: "unexpected symbol",
    },
    Case {
        lang: "f90",
        tools: &["gfortran"],
        package: "gfortran",
        main: r#"program main
  implicit none
  character(len=64) :: a1, a2, line, file
  call get_command_argument(1, a1)
  call get_command_argument(2, a2)
  read (*, '(A)') line
  open (10, file='in.txt', status='old')
  read (10, '(A)') file
  close (10)
  print '(8A)', 'args=', trim(a1), ',', trim(a2), ' stdin=', trim(line), ' file=', trim(file)
  open (11, file='out.txt', status='replace')
  write (11, '(A)') 'from f90'
  close (11)
  write (0, '(A)') 'warn'
  call exit(3)
end program main
"#,
        runtime_error: "program main\n  integer :: a(3), i\n  i = 5\n  a(i) = 1\n  print *, a(i)\nend program main\n",
        runtime_status: "failed",
        runtime_stderr: "At line 4 of file main.f90",
        compile_error: "program main\n  x = \nend program main\n",
        compile_stderr: "main.f90:2:",
    },
    Case {
        lang: "d",
        tools: &["gdc"],
        package: "gdc",
        main: r#"import std.stdio, std.file, std.string;
int main(string[] args) {
    auto line = readln().strip();
    auto file = readText("in.txt").splitLines()[0];
    writefln("args=%s,%s stdin=%s file=%s", args[1], args[2], line, file);
    std.file.write("out.txt", "from d\n");
    stderr.writeln("warn");
    return 3;
}
"#,
        runtime_error: "void main() {\n    int[] a;\n    throw new Exception(\"boom\");\n}\n",
        runtime_status: "failed",
        runtime_stderr: "object.Exception@main.d(3): boom",
        compile_error: "void main() {\n    int x = \"s\";\n}\n",
        compile_stderr: "main.d:2:13: error: cannot implicitly convert",
    },
];

/// Fails loudly (never skips) when the toolchain is not installed.
fn require_toolchain(case: &Case) {
    for tool in case.tools {
        assert!(
            Path::new("/usr/bin").join(tool).exists(),
            "/usr/bin/{tool} is missing: install the Debian package {} (apt-get install {}; .ci/run does)",
            case.package,
            case.package
        );
    }
}

/// Quotes as gcc prints them, in any locale: plain ASCII ones are what we match.
fn plain(stderr: &Value) -> String {
    stderr.as_str().unwrap_or_default().replace(['‘', '’'], "'")
}

/// Every behaviour of one language, in three runs on one server.
fn check(lang: &str) {
    let case = CASES.iter().find(|c| c.lang == lang).unwrap();
    require_toolchain(case);
    let s = Server::start();
    let c = Client::anonymous(&s);
    let up = c.upload("in.txt", "text/plain", b"12\nsecond line\n");
    let r = c.exec(json!({
        "lang": case.lang,
        "code": case.main,
        "args": ["a", "b c"],
        "stdin": "line one\n",
        "files": [up.input("in.txt")],
    }));
    assert_eq!(r["status"], "failed", "{lang}: {r}");
    assert_eq!(r["exit_code"], 3, "{lang}: {r}");
    assert_eq!(r["stdout"], "args=a,b c stdin=line one file=12\n", "{lang}: {r}");
    assert_eq!(r["stderr"], "warn\n", "{lang}: {r}");
    assert_eq!(
        download_output(&c, &r, "out.txt"),
        format!("from {lang}\n").as_bytes(),
        "{lang}"
    );
    // The build stays in the run's /tmp: only the program's own file comes back.
    let names: Vec<&str> = r["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["inherited"] != true)
        .filter_map(|f| f["name"].as_str())
        .collect();
    assert_eq!(names, ["out.txt"], "{lang}: {r}");

    let r = s.exec(json!({"lang": case.lang, "code": case.runtime_error}));
    assert_eq!(r["status"], case.runtime_status, "{lang}: {r}");
    assert!(plain(&r["stderr"]).contains(case.runtime_stderr), "{lang}: {r}");

    let r = s.exec(json!({"lang": case.lang, "code": case.compile_error}));
    assert_eq!(r["status"], "failed", "{lang}: {r}");
    assert_ne!(r["exit_code"], 0, "{lang}: {r}");
    assert_eq!(r["stdout"], "", "{lang}: {r}");
    assert!(plain(&r["stderr"]).contains(case.compile_stderr), "{lang}: {r}");
}

#[test]
fn c() {
    check("c");
}

#[test]
fn cpp() {
    check("cpp");
}

#[test]
fn go() {
    check("go");
}

#[test]
fn java() {
    check("java");
}

#[test]
fn php() {
    check("php");
}

#[test]
fn rust() {
    check("rs");
}

#[test]
fn r() {
    check("r");
}

#[test]
fn fortran() {
    check("f90");
}

#[test]
fn d() {
    check("d");
}

#[test]
fn every_name_and_alias_runs() {
    for case in CASES {
        require_toolchain(case);
    }
    let s = Server::start();
    // The cheapest program of each: all answer to every name LibreChat may send.
    for (names, code) in [
        (
            &["c", "C"][..],
            "#include <stdio.h>\nint main(void) { puts(\"ok\"); return 0; }\n",
        ),
        (
            &["cpp", "c++"][..],
            "#include <cstdio>\nint main() { std::puts(\"ok\"); }\n",
        ),
        (&["golang"][..], "package main\n\nfunc main() { println(\"ok\") }\n"),
        (&["rust"][..], "fn main() { println!(\"ok\"); }\n"),
        (&["fortran"][..], "print '(A)', 'ok'\nend\n"),
        (&["PHP"][..], "<?php echo \"ok\\n\";\n"),
        (&["R"][..], "cat(\"ok\\n\")\n"),
    ] {
        for name in names {
            let r = s.exec(json!({"lang": name, "code": code}));
            assert_eq!(r["status"], "ok", "{name}: {r}");
            assert!(r["stdout"] == "ok\n" || r["stderr"] == "ok\n", "{name}: {r}");
        }
    }
}

#[test]
fn the_jvm_and_go_fit_small_limits() {
    for case in CASES.iter().filter(|c| c.lang == "java" || c.lang == "go") {
        require_toolchain(case);
    }
    let s = Server::start();
    // The JVM sizes its heap from the memory limit and starts few threads; Go's
    // compiler and program stay within a small pids limit.
    let limits = json!({"memory_limit_mb": 128, "max_processes": 32});
    let r = s.exec(json!({
        "lang": "java",
        "code": "public class T {\n    public static void main(String[] a) {\n        long max = Runtime.getRuntime().maxMemory() >> 20;\n        System.out.println(max <= 64 && new java.io.File(\"/proc/self/task\").list().length < 32);\n    }\n}\n",
        "limits": limits,
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "true\n", "{r}");
    let r = s.exec(json!({
        "lang": "go",
        "code": "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"ok\") }\n",
        "limits": limits,
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "ok\n", "{r}");
}

#[test]
fn a_missing_toolchain_is_an_unsupported_capability_and_doctor_says_why() {
    let s = Server::start_with(&[("SANDCALL_TOOLCHAIN_PATH", r#"["/nonexistent"]"#)], "");
    for (route, lang) in [
        ("/v1/exec", "c"),
        ("/v1/exec", "java"),
        ("/v1/exec", "rs"),
        ("/v1/exec/programmatic", "go"),
    ] {
        let (status, v) = s.post(route, &json!({"lang": lang, "code": "x", "tools": []}));
        assert_eq!(status, 400, "{route} {lang}: {v}");
        assert_eq!(v["error_type"], "unsupported_language", "{v}");
        assert_eq!(v["code"], "unsupported_capability", "{v}");
        assert!(
            !v["error"].as_str().unwrap().contains("/nonexistent"),
            "a host path: {v}"
        );
    }
    // The interpreted languages are untouched.
    assert_eq!(s.py("print(1)")["stdout"], "1\n");
    assert_eq!(s.bash("echo 1")["stdout"], "1\n");
    let dir = Server::new_dir();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["doctor", "--data-dir"])
        .arg(dir.join("data"))
        .env("SANDCALL_TOOLCHAIN_PATH", r#"["/nonexistent"]"#)
        .env("SANDCALL_INSTALL_RUNTIME", "false")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("- c: missing toolchain (Debian packages gcc libc6-dev): gcc not found in /nonexistent (config `toolchain_path`)"),
        "{text}"
    );
    assert!(
        text.contains("- rust: missing toolchain (Debian package rustc): "),
        "{text}"
    );
}

#[test]
fn programs_in_compiled_languages_cannot_call_tools() {
    let s = Server::start();
    let (status, v) = s.post(
        "/v1/exec/programmatic",
        &json!({"lang": "c", "code": "int main(void) { return 0; }", "tools": []}),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["code"], "unsupported_capability", "{v}");
    assert!(v["error"].as_str().unwrap().contains("cannot call tools"), "{v}");
}

/// Two languages an operator declares: an interpreter (awk) and a compiled one (C under
/// a name of its own, built by its own command).
const DECLARED: &str = r#"
[[languages]]
names = ["awk", "GAWK"]
code_file = "main.awk"
run = 'awk -f "$CODE"'
tools = ["awk"]

[[languages]]
names = ["c89"]
code_file = "prog.c"
compile = 'cc -std=c89 -pedantic-errors -o "$BUILD/prog" prog.c'
run = '"$BUILD/prog"'
tools = ["cc"]

[[languages]]
names = ["nothing"]
code_file = "main.x"
run = '/nonexistent/x "$CODE"'
tools = ["/nonexistent/x"]
"#;

#[test]
fn an_operator_declares_languages_in_the_config() {
    let s = Server::start_with(&[], DECLARED);
    let r = s.exec(json!({
        "lang": "gawk",
        "code": "{ n += $1 }\nEND { print first, n; print \"warn\" > \"/dev/stderr\"; exit 4 }\n",
        // awk's operands: an assignment, made before it reads stdin.
        "args": ["first=x y"],
        "stdin": "1\n2\n3\n",
    }));
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["exit_code"], 4, "{r}");
    assert_eq!(r["stdout"], "x y 6\n", "{r}");
    assert_eq!(r["stderr"], "warn\n", "{r}");
    // A compile step that fails is a failed run with the compiler's message.
    let r = s.exec(json!({"lang": "c89", "code": "int main(void) {\n    // not C89\n    return 0;\n}\n"}));
    assert_eq!(r["status"], "failed", "{r}");
    assert!(plain(&r["stderr"]).contains("prog.c:2:5: error"), "{r}");
    let r = s.exec(json!({"lang": "C89", "code": "#include <stdio.h>\nint main(int c, char **v) { printf(\"%s\\n\", v[1]); return 0; }\n", "args": ["hi"]}));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "hi\n", "{r}");
    // Declared, but its tool is not there: refused like a built-in language.
    let (status, v) = s.post("/v1/exec", &json!({"lang": "nothing", "code": "x"}));
    assert_eq!((status, &v["code"]), (400, &json!("unsupported_capability")), "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("cannot run nothing programs"),
        "{v}"
    );
    // Not declared at all: the answer names the operator's languages too.
    let (status, v) = s.post("/v1/exec", &json!({"lang": "cobol", "code": "x"}));
    assert_eq!((status, &v["code"]), (400, &json!("unsupported_capability")), "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("or this server's own: awk, c89, nothing;"),
        "{v}"
    );
}

#[test]
fn a_declared_language_may_not_take_a_built_in_name() {
    let dir = Server::new_dir();
    let config = dir.join("bad.toml");
    std::fs::write(
        &config,
        "[[languages]]\nnames = [\"py\"]\ncode_file = \"main.py\"\nrun = 'python3 \"$CODE\"'\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["doctor", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("languages[0]: name \"py\" is already a language's name"),
        "{text}"
    );
}
