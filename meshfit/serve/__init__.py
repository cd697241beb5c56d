"""A saved model put to use: --mode=eval (evaluate), --mode=predict
(predict) and --mode=export (export, export_tf, model_card), and where
their outputs may go (outputs).

May import every sub-package but train.
"""
