# ruff: noqa: E501  (each hand-written Japanese sentence stays whole on its line, easier to review)
"""Writes train.jsonl / validation.jsonl: Japanese product reviews we wrote ourselves (no downloads).

Every sentence below was written by hand for its category and rating; a review joins an opening, one or two
remarks about the product and a closing of matching tone, so reviews vary in length and content while each
still reads as one person's review. Deterministic (seeded): `python compose_reviews.py` rewrites the same
files, and tests/runtime checks that the committed files match this script.

`python compose_reviews.py --hub-layout DIR` writes the same reviews in the layout of the Hub's
mteb/amazon_reviews_multi instead: DIR/ja/{train,validation}.jsonl with `id`, `text`, `label` (stars - 1) and
`label_text`, sorted by label as the Hub's files are. Pointing a sample's dataFiles at DIR instead of
hf://datasets/mteb/amazon_reviews_multi runs it offline through the same loading code.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 20261202
PER_STAR = 80          # reviews per star rating (1..5)
VALIDATION_PER_STAR = 16

# Openings and closings by star rating: how people start and end reviews, independent of the product.
OPENINGS: dict[int, list[str]] = {
    5: ["買って本当に良かったです。", "文句なしの星5つです。", "期待以上でした！", "家族にも好評で大満足です。",
        "リピート購入しました。", "ずっと探していたものにやっと出会えました。", "迷っている方にはぜひおすすめしたいです。",
        "届いてすぐに使い始めましたが、最高です。"],
    4: ["概ね満足しています。", "値段を考えると十分良い買い物でした。", "星4つにしました。", "細かい不満はありますが気に入っています。",
        "思っていたより良かったです。", "使い始めて一ヶ月ほど経ちました。", "全体的には満足です。", "購入して正解でした。"],
    3: ["可もなく不可もなくといったところです。", "普通です。", "星3つが妥当だと思います。", "良い点と悪い点が半々です。",
        "値段なりという印象です。", "期待が大きすぎたのかもしれません。", "悪くはないのですが、特別良くもありません。",
        "しばらく使ってみての感想です。"],
    2: ["正直、期待外れでした。", "少し残念な買い物でした。", "星2つです。", "写真で見た印象とはだいぶ違いました。",
        "もう少し良いものを想像していました。", "レビューを信じて買いましたが微妙でした。", "あまりおすすめはできません。",
        "使ってみて不満の方が多かったです。"],
    1: ["最悪です。", "買わなければよかったです。", "お金を捨てたような気分です。", "二度と買いません。",
        "ひどい商品でした。", "返品しました。", "これはさすがに酷いと思います。", "届いた瞬間からがっかりしました。"],
}
CLOSINGS: dict[int, list[str]] = {
    5: ["また買いたいと思います。", "友人にもすすめました。", "本当におすすめです。", "大事に使っていきます。",
        "この値段でこの品質なら文句はありません。", "買ってよかったと心から思います。"],
    4: ["次もこのメーカーを選ぶと思います。", "少し改善されれば星5つです。", "おおむねおすすめできます。",
        "コスパは良いと思います。", "満足度は高めです。", "気になる点はありますが、買って損はないです。"],
    3: ["次に買うかどうかは分かりません。", "こだわりがなければ十分かもしれません。", "値段相応だと思います。",
        "もう少し様子を見てみます。", "特に不満はありませんが感動もありません。", "人によって評価が分かれそうです。"],
    2: ["次は別のものを探します。", "この値段なら他を選んだほうがいいです。", "改善を期待しています。",
        "ちょっと残念でした。", "購入はおすすめしません。", "我慢して使っていますが満足はしていません。"],
    1: ["絶対におすすめしません。", "返金してほしいです。", "時間とお金の無駄でした。", "皆さんも気をつけてください。",
        "こんな商品を売らないでほしいです。", "怒りしかありません。"],
}

# Per category: a few product names, and remarks that praise ("good"), criticise ("bad") or hedge ("mixed").
CATEGORIES: dict[str, dict[str, list[str]]] = {
    "家電": {
        "items": ["掃除機", "電気ケトル", "ドライヤー", "空気清浄機", "電子レンジ"],
        "good": ["{item}の音が静かで、夜でも気兼ねなく使えます。", "スイッチを入れてからすぐに動くので時短になります。",
                 "デザインがシンプルで部屋になじみます。", "パワーがあるのに電気代が安く済んでいます。",
                 "操作が分かりやすく、説明書を読まなくても使えました。", "軽いので母でも楽に持ち運べます。"],
        "bad": ["{item}の音がうるさくて、夜は使えません。", "一週間で電源が入らなくなりました。",
                "説明書が分かりにくく、設定に一時間かかりました。", "思ったよりパワーが弱くて使い物になりません。",
                "本体が重くて持ち運ぶのが大変です。", "使っていると変な臭いがしてきて不安になります。"],
        "mixed": ["性能は普通ですが、コードがもう少し長ければ良かったです。", "機能は十分ですが、ボタンが少し押しにくいです。",
                  "音はやや大きめですが、仕事はきちんとしてくれます。"],
    },
    "本": {
        "items": ["小説", "ビジネス書", "料理本", "エッセイ", "参考書"],
        "good": ["一気に最後まで読んでしまいました。", "{item}としては珍しく、具体例が多くて分かりやすいです。",
                 "登場人物の心情が丁寧に描かれていて泣けました。", "読み終わったあと、前向きな気持ちになれました。",
                 "説明が丁寧で、初心者でも理解できます。", "何度も読み返したくなる一冊です。"],
        "bad": ["内容が薄く、タイトル倒れだと感じました。", "誤字脱字が多くて読む気が失せました。",
                "同じ話の繰り返しで途中で飽きてしまいました。", "書いてあることが古く、今では役に立ちません。",
                "届いた{item}の表紙が折れていて、中古品のようでした。", "文章が読みにくく、何が言いたいのか分かりません。"],
        "mixed": ["前半は面白いのですが、後半が少し駆け足です。", "内容は良いものの、文字が小さくて読みにくいです。",
                  "知っている話も多く、新しい発見は少なめでした。"],
    },
    "ファッション": {
        "items": ["ワンピース", "パーカー", "ジャケット", "Tシャツ", "セーター"],
        "good": ["生地がしっかりしていて、洗濯しても形が崩れません。", "サイズ感がぴったりで、着心地も抜群です。",
                 "色が写真通りでとてもきれいです。", "{item}を着て出かけたら友人に褒められました。",
                 "肌触りが柔らかく、一日中着ていても疲れません。", "細身に見えるシルエットで気に入っています。"],
        "bad": ["一度洗っただけで縮んでしまいました。", "生地が薄く、透けて見えるので外では着られません。",
                "写真と色が全然違っていて驚きました。", "縫い目がほつれていて、すぐに穴があきました。",
                "サイズ表記より明らかに小さく、着られませんでした。", "{item}から化学的な臭いがして、何度洗っても取れません。"],
        "mixed": ["デザインは好きですが、生地が少しチクチクします。", "色は良いのですが、思ったより丈が短かったです。",
                  "着心地は普通で、値段相応の品質だと思います。"],
    },
    "食品": {
        "items": ["コーヒー豆", "お米", "ドライフルーツ", "レトルトカレー", "緑茶"],
        "good": ["香りが良くて、毎朝の楽しみになっています。", "甘すぎず、子どもも喜んで食べています。",
                 "{item}がこの値段でこの味なら十分です。", "賞味期限が長いので買い置きに便利です。",
                 "素材の味がしっかりしていて、とてもおいしいです。", "小分けになっているので使いやすいです。"],
        "bad": ["味が薄く、正直おいしくありませんでした。", "届いた時点で賞味期限が近く、食べきれませんでした。",
                "袋が破れていて中身がこぼれていました。", "{item}なのに香りがほとんどしません。",
                "しょっぱすぎて最後まで食べられませんでした。", "写真と比べて量が少なすぎます。"],
        "mixed": ["味は悪くないですが、少し値段が高めです。", "おいしいのですが、好みが分かれる味だと思います。",
                  "量は十分ですが、風味はもう一歩という感じです。"],
    },
    "キッチン用品": {
        "items": ["フライパン", "包丁", "保存容器", "まな板", "電気圧力鍋"],
        "good": ["{item}に食材がくっつかず、洗い物も楽になりました。", "切れ味が鋭く、トマトもきれいに切れます。",
                 "丈夫で長く使えそうです。", "食洗機に入れられるのが本当に助かります。",
                 "軽くて扱いやすく、料理が楽しくなりました。", "しっかり密閉できるので汁物も安心です。"],
        "bad": ["一ヶ月でコーティングがはがれてきました。", "すぐに錆びてしまい、がっかりしています。",
                "蓋がきちんと閉まらず、中身が漏れました。", "{item}が思ったより小さくて使いにくいです。",
                "取っ手がぐらついていて危ないです。", "プラスチックの臭いが食材に移ってしまいます。"],
        "mixed": ["使い勝手は良いのですが、少し重いです。", "品質は普通ですが、収納しにくい形です。",
                  "焦げ付きにくさは値段なりだと思います。"],
    },
    "美容": {
        "items": ["化粧水", "シャンプー", "日焼け止め", "ハンドクリーム", "洗顔フォーム"],
        "good": ["肌がしっとりして、翌朝まで潤いが続きます。", "香りが優しく、使うたびに癒やされます。",
                 "敏感肌ですが、{item}で荒れることはありませんでした。", "伸びが良いので少量で足ります。",
                 "べたつかず、さらっとした使い心地です。", "使い始めてから髪のまとまりが良くなりました。"],
        "bad": ["使った翌日に肌が赤くなってしまいました。", "香りがきつすぎて気分が悪くなります。",
                "べたべたして、つけた後の不快感がすごいです。", "{item}の効果を全く感じられませんでした。",
                "容器が使いにくく、最後まで出てきません。", "すぐになくなるので、コスパが悪すぎます。"],
        "mixed": ["保湿力はありますが、香りが少し強めです。", "使い心地は良いものの、値段が気になります。",
                  "肌には合っていますが、劇的な変化はありません。"],
    },
    "おもちゃ": {
        "items": ["積み木", "ぬいぐるみ", "パズル", "ラジコン", "ボードゲーム"],
        "good": ["子どもが夢中になって毎日遊んでいます。", "作りがしっかりしていて、乱暴に扱っても壊れません。",
                 "家族みんなで{item}を楽しめました。", "角が丸くなっているので小さい子にも安心です。",
                 "色がきれいで、部屋に置いてもかわいいです。", "遊びながら自然と数を覚えてくれました。"],
        "bad": ["すぐに部品が外れて、子どもが泣いてしまいました。", "{item}の塗装がはげて、手に色がつきます。",
                "説明書が分かりにくく、大人でも遊び方が理解できません。", "電池の減りが異常に早いです。",
                "部品が足りず、最後まで完成しませんでした。", "思ったよりずっと小さく、子どもも興味を示しませんでした。"],
        "mixed": ["子どもは喜んでいますが、少し音が大きいです。", "楽しいのですが、対象年齢より難しく感じました。",
                  "品質は普通で、すぐ飽きてしまいそうです。"],
    },
    "スポーツ・アウトドア": {
        "items": ["テント", "ランニングシューズ", "ヨガマット", "水筒", "寝袋"],
        "good": ["軽くて持ち運びが楽なので、キャンプに重宝しています。", "{item}のクッション性が高く、長時間でも疲れません。",
                 "設営が簡単で、一人でも十分に組み立てられました。", "保温力が高く、夕方まで温かいままでした。",
                 "滑りにくく、安心して運動できます。", "雨の日でも中は全く濡れませんでした。"],
        "bad": ["一回使っただけで縫い目から水が漏れてきました。", "{item}が重すぎて、持って行く気になりません。",
                "すぐに底がすり減ってしまいました。", "説明と違ってまったく保温されません。",
                "組み立てに必要な部品が入っていませんでした。", "ゴムの臭いがひどく、部屋に置いておけません。"],
        "mixed": ["使いやすいのですが、収納袋が小さくてしまいにくいです。", "機能は十分ですが、色の種類が少ないです。",
                  "悪くはないものの、本格的な登山には向かないと思います。"],
    },
    "パソコン周辺機器": {
        "items": ["キーボード", "マウス", "モニター", "USBハブ", "ヘッドセット"],
        "good": ["接続がすぐに完了し、遅延も感じません。", "{item}の打ち心地が良く、長時間の作業も快適です。",
                 "画面が明るく、文字がくっきり見えます。", "電池持ちが良く、一ヶ月以上交換していません。",
                 "コンパクトで、出張にも持って行けます。", "ドライバーなしですぐに使えました。"],
        "bad": ["頻繁に接続が切れて仕事になりません。", "数日で一部のキーが反応しなくなりました。",
                "画面にドット抜けがあり、交換を依頼しました。", "{item}を挿すとパソコンが熱くなり、怖くて使えません。",
                "音声にノイズが入って会議で聞き返されます。", "ホイールがすぐに空回りするようになりました。"],
        "mixed": ["性能は問題ありませんが、ケーブルが硬くて取り回しにくいです。", "使えてはいますが、ボタンの音が気になります。",
                  "値段を考えれば妥当ですが、高級感はありません。"],
    },
    "ペット用品": {
        "items": ["キャットタワー", "ドッグフード", "猫砂", "ペットベッド", "リード"],
        "good": ["うちの猫がすぐに気に入って、毎日{item}の上で寝ています。", "食いつきが良く、残さずに食べてくれます。",
                 "臭いがしっかり抑えられていて助かります。", "丈夫な作りで、噛まれても壊れません。",
                 "洗濯機で洗えるので清潔に保てます。", "組み立ても簡単で、ぐらつきもありません。"],
        "bad": ["うちの犬は全く食べようとしません。", "{item}がすぐにぐらつき、危なくて使えません。",
                "臭いが全然取れず、部屋中に広がります。", "一週間で糸がほつれて、中の綿が出てきました。",
                "届いた袋が破れていて、中身が散らばっていました。", "サイズ表記が小さすぎて、うちの子には使えませんでした。"],
        "mixed": ["気に入ってくれていますが、少し毛が付きやすいです。", "品質は悪くないのですが、値段が少し高いと思います。",
                  "最初は警戒していましたが、今はたまに使っています。"],
    },
}

SHIPPING: dict[int, list[str]] = {  # occasional remarks about delivery, with the same tone as the rating
    5: ["注文の翌日に届きました。", "梱包も丁寧でした。"],
    4: ["配送も早くて助かりました。"],
    3: ["配送は普通でした。"],
    2: ["届くまでに二週間もかかりました。"],
    1: ["箱がつぶれた状態で届きました。", "問い合わせても返事がありません。"],
}


def _remark(rng: random.Random, cat: dict[str, list[str]], kind: str, used: set[str]) -> str:
    choices = [s for s in cat[kind] if s not in used] or cat[kind]
    s = rng.choice(choices)
    used.add(s)
    return s.format(item=rng.choice(cat["items"]))


def compose_review(rng: random.Random, stars: int, category: str) -> str:
    cat = CATEGORIES[category]
    used: set[str] = set()
    # Remark mix by rating: 5 = praise only, 4 = praise with a reservation, 3 = hedged, 2/1 = criticism.
    plan = {5: ["good", "good"], 4: ["good", "mixed"], 3: ["mixed", rng.choice(["good", "bad"])],
            2: ["bad", rng.choice(["mixed", "bad"])], 1: ["bad", "bad"]}[stars]
    if rng.random() < 0.35:
        plan = plan[:1]  # short reviews exist too
    parts = [rng.choice(OPENINGS[stars])] + [_remark(rng, cat, k, used) for k in plan]
    if rng.random() < 0.25:
        parts.append(rng.choice(SHIPPING[stars]))
    if rng.random() < 0.75:
        parts.append(rng.choice(CLOSINGS[stars]))
    return "".join(parts)


def compose(seed: int = SEED) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    rng = random.Random(seed)
    names = list(CATEGORIES)
    train: list[dict[str, object]] = []
    validation: list[dict[str, object]] = []
    seen: set[str] = set()
    for stars in (1, 2, 3, 4, 5):
        rows = []
        i = 0
        while len(rows) < PER_STAR:
            category = names[i % len(names)]
            i += 1
            body = compose_review(rng, stars, category)
            if body in seen:
                continue  # every review text is unique
            seen.add(body)
            rows.append({"review_body": body, "stars": stars, "product_category": category})
        validation += rows[:VALIDATION_PER_STAR]
        train += rows[VALIDATION_PER_STAR:]
    rng.shuffle(train)
    rng.shuffle(validation)
    for n, r in enumerate(train):
        r["review_id"] = f"tr-{n:04d}"
    for n, r in enumerate(validation):
        r["review_id"] = f"va-{n:04d}"
    return train, validation


def render(rows: list[dict[str, object]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def hub_rows(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Rows as mteb/amazon_reviews_multi's JSONL files carry them: label = stars - 1, sorted by label (stable)."""
    out = [{"id": f"ja_{r['review_id']}", "text": r["review_body"], "label": int(str(r["stars"])) - 1,
            "label_text": str(int(str(r["stars"])) - 1)} for r in rows]
    return sorted(out, key=lambda r: int(str(r["label"])))


def write_hub_layout(root: Path, lang: str = "ja") -> dict[str, Path]:
    """root/<lang>/{train,validation}.jsonl in the Hub's layout; returns {split: file}."""
    train, validation = compose()
    (root / lang).mkdir(parents=True, exist_ok=True)
    files = {}
    for split, rows in (("train", train), ("validation", validation)):
        files[split] = root / lang / f"{split}.jsonl"
        files[split].write_text(render(hub_rows(rows)), encoding="utf-8")
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hub-layout", type=Path, metavar="DIR",
                        help="write DIR/ja/{train,validation}.jsonl in mteb/amazon_reviews_multi's layout instead")
    args = parser.parse_args()
    if args.hub_layout:
        files = write_hub_layout(args.hub_layout)
        print(f"wrote {', '.join(str(f) for f in files.values())}")
        return
    train, validation = compose()
    (HERE / "train.jsonl").write_text(render(train), encoding="utf-8")
    (HERE / "validation.jsonl").write_text(render(validation), encoding="utf-8")
    print(f"wrote {len(train)} train and {len(validation)} validation reviews to {HERE}")


if __name__ == "__main__":
    main()
