pub async fn _todo() {}
