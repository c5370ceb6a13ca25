//! `sandbox.fs` against the embedded engine.

use crate::common;

use daytona::fs::DownloadResult;
use daytona::{FileDownloadRequest, FileUpload};

#[tokio::test]
async fn upload_download_list_and_info() {
    let (_d, sb) = common::sandbox().await;
    let fs = &sb.fs;
    fs.create_folder("project-files", "755").await.unwrap();
    let local = std::env::temp_dir().join(format!("dtn-local-{}.txt", std::process::id()));
    std::fs::write(&local, "from the host\n").unwrap();
    fs.upload_files(vec![
        FileUpload {
            source: local.to_string_lossy().into_owned().into(),
            destination: "project-files/example.txt".into(),
        },
        FileUpload {
            source: b"{\"debug\": true}".into(),
            destination: "project-files/config.json".into(),
        },
        FileUpload {
            source: b"\x00\xffbinary".into(),
            destination: "/home/daytona/project-files/deep/bin.dat".into(),
        },
    ])
    .await
    .unwrap();
    assert_eq!(
        fs.download_file("project-files/example.txt").await.unwrap(),
        b"from the host\n"
    );
    assert_eq!(
        fs.download_file("project-files/deep/bin.dat")
            .await
            .unwrap(),
        b"\x00\xffbinary"
    );
    fs.upload_file(b"Hello, World!", "path/to/file.txt")
        .timeout(60)
        .await
        .unwrap();
    assert!(fs
        .download_file("path/to/file.txt")
        .timeout(-1)
        .await
        .unwrap_err()
        .is_validation());
    assert_eq!(
        fs.download_file("/home/daytona/path/to/file.txt")
            .await
            .unwrap(),
        b"Hello, World!"
    );

    let names: Vec<String> = fs
        .list_files("project-files")
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.name)
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, ["config.json", "deep", "example.txt"]);
    assert_eq!(
        fs.list_files("project-files").depth(2).await.unwrap().len(),
        4
    );
    assert!(fs
        .list_files(".")
        .depth(0)
        .await
        .unwrap_err()
        .is_validation());

    let info = fs.get_file_info("project-files/config.json").await.unwrap();
    assert_eq!(info.name, "config.json");
    assert!(!info.is_dir);
    assert_eq!(info.size, 15);
    assert_eq!(info.mode, "-rw-r--r--");
    assert_eq!(info.permissions, "0644");
    assert!(info.owner.parse::<u32>().is_ok());
    assert!(info.modified_at.ends_with('Z'));
    let dir = fs.get_file_info("project-files").await.unwrap();
    assert!(dir.is_dir);
    assert_eq!(dir.mode, "drwxr-xr-x");

    let missing = fs.download_file("nope.txt").await.unwrap_err();
    assert!(missing.is_not_found());
    assert_eq!(missing.code(), Some("FILE_NOT_FOUND"));
    assert!(missing.to_string().starts_with("Failed to download file: "));
    assert!(fs
        .download_file("project-files")
        .await
        .unwrap_err()
        .is_validation());

    let local_out = std::env::temp_dir().join(format!("dtn-out-{}.json", std::process::id()));
    let got = fs
        .download_files(vec![
            FileDownloadRequest {
                source: "project-files/config.json".into(),
                destination: Some(local_out.to_string_lossy().into_owned()),
            },
            FileDownloadRequest {
                source: "project-files/example.txt".into(),
                destination: None,
            },
            FileDownloadRequest {
                source: "missing".into(),
                destination: None,
            },
        ])
        .await
        .unwrap();
    assert_eq!(
        got[0].result,
        Some(DownloadResult::Path(
            local_out.to_string_lossy().into_owned()
        ))
    );
    assert_eq!(std::fs::read(&local_out).unwrap(), b"{\"debug\": true}");
    assert_eq!(
        got[1].result,
        Some(DownloadResult::Bytes(b"from the host\n".to_vec()))
    );
    assert!(got[2].result.is_none());
    assert!(got[2].error.as_deref().unwrap().contains("file not found"));
    assert_eq!(
        got[2].error_details.as_ref().unwrap().status_code,
        Some(404)
    );
    fs.download_file("project-files/example.txt")
        .local_path(local_out.to_string_lossy().into_owned())
        .await
        .unwrap();
    assert_eq!(std::fs::read(&local_out).unwrap(), b"from the host\n");
    let _ = std::fs::remove_file(local);
    let _ = std::fs::remove_file(local_out);
    sb.delete().await.unwrap();
}

#[tokio::test]
async fn find_search_replace_move_delete_permissions() {
    let (_d, sb) = common::sandbox().await;
    let fs = &sb.fs;
    fs.upload_file(b"var a = 1;\nvar obj1 = new Base();\n", "src/a.js")
        .await
        .unwrap();
    fs.upload_file(b"x\nvar obj1 = new Base(); // again\n", "src/sub/b.js")
        .await
        .unwrap();
    fs.upload_file(b"\x00binary var obj1 = new Base();", "src/c.bin")
        .await
        .unwrap();
    let m = fs
        .find_files("src", "var obj1 = new Base();")
        .await
        .unwrap();
    let hits: Vec<(String, i64)> = m.iter().map(|m| (m.file.clone(), m.line)).collect();
    assert_eq!(hits, [("src/a.js".into(), 2), ("src/sub/b.js".into(), 2)]);
    assert_eq!(m[1].content, "var obj1 = new Base(); // again");
    let abs = fs
        .find_files("/home/daytona/src/a.js", "var a")
        .await
        .unwrap();
    assert_eq!(abs[0].file, "/home/daytona/src/a.js");

    let found = fs.search_files("src", "*.js").await.unwrap();
    assert_eq!(found.files, ["src/a.js", "src/sub/b.js"]);
    assert_eq!(
        fs.search_files("src", "s?b").await.unwrap().files,
        ["src/sub"]
    );

    let r = fs
        .replace_in_files(
            vec!["src/a.js".into(), "src/missing.js".into()],
            "var",
            "let",
        )
        .await
        .unwrap();
    assert!(r[0].success && !r[1].success);
    assert!(r[1].error.is_some());
    assert_eq!(
        fs.download_file("src/a.js").await.unwrap(),
        b"let a = 1;\nlet obj1 = new Base();\n"
    );

    fs.move_files("src/a.js", "src/moved.js").await.unwrap();
    assert!(fs
        .get_file_info("src/a.js")
        .await
        .unwrap_err()
        .is_not_found());
    let clash = fs
        .move_files("src/moved.js", "src/c.bin")
        .await
        .unwrap_err();
    assert!(clash.is_conflict(), "{clash}");

    fs.set_file_permissions("src/moved.js")
        .mode("700".to_string())
        .await
        .unwrap();
    assert_eq!(
        fs.get_file_info("src/moved.js").await.unwrap().permissions,
        "0700"
    );
    assert!(fs
        .set_file_permissions("src/moved.js")
        .mode("rwx".to_string())
        .await
        .unwrap_err()
        .is_validation());
    fs.set_file_permissions("src/moved.js")
        .owner("daytona".to_string())
        .await
        .unwrap();
    assert!(fs
        .set_file_permissions("nope")
        .mode("644".to_string())
        .await
        .unwrap_err()
        .is_not_found());

    let dir = fs.delete_file("src").await.unwrap_err();
    assert!(dir.is_validation());
    assert!(dir
        .to_string()
        .contains("cannot delete directory without recursive flag"));
    fs.delete_file("src/c.bin").await.unwrap();
    fs.delete_file("src").recursive(true).await.unwrap();
    assert!(fs.list_files("src").await.unwrap_err().is_not_found());
    assert!(fs.delete_file("src").await.unwrap_err().is_not_found());
    assert!(fs
        .create_folder("x", "9z")
        .await
        .unwrap_err()
        .is_validation());
    sb.delete().await.unwrap();
}
