"""Looking inside a trained ViT: where it attends, whether those maps tell the truth, which heads
and tokens carry the prediction. Each module builds only on the ones it names:

    watching      AttentionMaps, EvidenceMass: maps while training <- maps, evidence, score, figures, hooks
    explore       the explorable HTML page of the maps (page.html) <- maps, hooks
    score         the maps scored: perturbation, evidence, sanity <- maps, evidence, hooks, stats
    head_analysis ablation, logit attribution, lens, norms        <- evidence, hooks, stats
    activation_patching  between image pairs                      <- evidence, hooks, stats
    evidence      evidence patches, and images with patches replaced <- maps
    maps          attention weights and the maps made from them   <- hooks
    hooks         where the tools read and write a ViT (hook points, the explicit path)
    stats         bootstrap intervals, Spearman's correlation and its test
    figures       matplotlib figures of all of the above (reads their results, no model code)
    tables        the text tables of score, heads and patch (reads their results) <- stats

`head_analysis` and `activation_patching` import nothing from `score`; the commands in `vit.commands` print
and save what these return.
"""
